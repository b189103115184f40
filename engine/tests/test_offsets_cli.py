"""`offsets show | reset | verify` on real Delta tables and the real broker.

Most tables here are written by the pipeline's own delta-rs sink (the same commit as a
pipeline batch: rows, txn actions, offsets and start in userMetadata) over records really
produced to Kafka, so no Spark session is needed; the tests marked `spark` run the real
pipeline around the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from conftest import skip_without_connectors
from kafka_delta.cli import main
from kafka_delta.commands.offsets import parser
from kafka_delta.commands.reset import (
    commit_reset,
    parse_duration,
    parse_when,
    plan_reset,
)
from kafka_delta.commands.table_log import CommandError, newest_commit
from kafka_delta.config import PipelineConfig
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.kafka.commit_back import OffsetCommitter
from kafka_delta.offsets.model import BatchCommit, Offsets
from kafka_delta.recovery.lease import (
    RunLease,
    is_active,
    leases_of,
    read_leases,
)
from kafka_delta.sinks.delta_rs.sink import DeltaRsSink
from kafka_delta_dev.produce import produce_events, produce_values
from support import PACKAGE, PROJECT

pytestmark = [pytest.mark.broker]

SRC = PROJECT / "src"


# -- helpers ----------------------------------------------------------------------------------


def _config_file(cfg: PipelineConfig, tmp_path: Path) -> str:
    path = tmp_path / "conf" / "test.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return str(path)


def _cli(cfg: PipelineConfig, tmp_path: Path, capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(["offsets", args[0], "--config", _config_file(cfg, tmp_path), *args[1:]])
    out, err = capsys.readouterr()
    return status, out, err


def _rows(first: int, count: int) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + count), pa.int64())})


def _sink_batches(
    cfg: PipelineConfig, batches: list[tuple[Offsets, Offsets]], app: str = "q1", first_batch=0
) -> None:
    """Commit ``(start, end)`` batches with the pipeline's delta-rs sink, as a run would
    (ids numbered by position so that the table's ids are distinct)."""
    sink = DeltaRsSink(cfg.delta.table, cfg.pipeline_id)
    for i, (start, end) in enumerate(batches, start=first_batch):
        count = sum(end[t][p] - start.get(t, {}).get(p, 0) for t in end for p in end[t])
        commit = BatchCommit(cfg.pipeline_id, f"{cfg.pipeline_id}.{app}", i, end)
        first = 1000 * i
        sink.commit_batch(_rows(first, count), commit.starting_at(start), start=start)


def _push_group(cfg: PipelineConfig, offsets: Offsets) -> None:
    committer = OffsetCommitter(cfg.kafka.client_config(), cfg.kafka.consumer_group)
    committer.submit(0, offsets)
    assert committer.close().succeeded == 1


def _group(cfg: PipelineConfig, partitions: dict[str, list[int]]) -> Offsets:
    return KafkaAdmin(cfg.kafka.client_config()).committed(cfg.kafka.consumer_group, partitions)


@pytest.fixture
def written(kafka_bootstrap, new_topics, make_config):
    """A topic of 2 partitions holding 40 records each, and a table whose pipeline read them
    in two batches (0-20, 20-40 per partition), the group aligned with it."""
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 80)
    cfg = make_config([topic])
    half = {topic: {0: 20, 1: 20}}
    end = {topic: {0: 40, 1: 40}}
    _sink_batches(cfg, [({}, half), (half, end)])
    _push_group(cfg, end)
    return cfg, topic


# -- show -------------------------------------------------------------------------------------


@pytest.fixture(params=["delta_rs", "delta_spark"])
def sink_engine(request, spark) -> dict[str, str]:
    engine = {"source": "embedded", "sink": request.param}
    skip_without_connectors(spark, engine)
    return engine


@pytest.mark.spark
def test_show_and_verify_after_a_real_pipeline_run_on_either_sink(
    spark, kafka_bootstrap, new_topics, make_config, sink_engine, tmp_path, capsys
) -> None:
    from kafka_delta.pipeline import Pipeline

    topics = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, topics, 120)
    # Two bad records go to the dead-letter table.
    produce_values(kafka_bootstrap, topics[0], [(0, b"not json"), (1, b"{}")])
    cfg = make_config(topics, engine=sink_engine, max_records_per_trigger=50)
    Pipeline(spark, cfg).run()
    admin = KafkaAdmin(cfg.kafka.client_config())
    latest = admin.latest(admin.partitions(topics))

    status, out, _ = _cli(cfg, tmp_path, capsys, "show", "--json")
    assert status == 0
    doc = json.loads(out)
    assert doc["rows"] == 120 and doc["dead_letters"] == 2 and doc["lag"] == 0
    newest = _newest(cfg)
    assert doc["stored"]["delta_version"] == newest.version
    assert [(r["topic"], r["partition"]) for r in doc["partitions"]] == [
        (t, p) for t in sorted(topics) for p in (0, 1)
    ]
    for row in doc["partitions"]:
        want = latest[row["topic"]][row["partition"]]
        assert row["stored_offset"] == row["group_offset"] == row["latest"] == want
        assert (row["earliest"], row["lag"], row["delta_version"]) == (0, 0, newest.version)
        assert row["batch_id"] == newest.record.batch_id > 0
        assert row["app_id"] == newest.record.app_id and row["committed_at"].endswith("Z")

    status, text, _ = _cli(cfg, tmp_path, capsys, "show")
    assert status == 0
    assert "120 rows; 2 dead letters" in text and "total lag: 0" in text
    for row in doc["partitions"]:
        (line,) = [
            x.split()
            for x in text.splitlines()
            if x.split()[:2] == [row["topic"], str(row["partition"])]
        ]
        assert line[2] == str(row["stored_offset"]) and line[-1] == "0"

    status, out, _ = _cli(cfg, tmp_path, capsys, "verify", "--ids", "id")
    assert status == 0, out
    assert "verify: OK" in out and "2 dead letters, all inside" in out
    assert "without a recorded start" not in out  # the pipeline records each batch's start
    assert leases_of(cfg) == []  # released at the end (beside the checkpoint on delta-spark)


def test_console_script_dispatch_runs_offsets_show_and_keeps_the_run_options(
    written, tmp_path
) -> None:
    cfg, topic = written
    env = dict(os.environ, PYTHONPATH=str(SRC))
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            PACKAGE,
            "offsets",
            "show",
            "--json",
            "--config",
            _config_file(cfg, tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["stored"]["offsets"] == {topic: {"0": 40, "1": 40}}
    # The run command's own options still parse (no subcommand name first).
    helped = subprocess.run(
        [sys.executable, "-m", PACKAGE, "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert helped.returncode == 0 and "--trigger" in helped.stdout and "offsets" in helped.stdout


def _broker_cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The embedded broker's tool, as scripts/broker.sh runs it."""
    return subprocess.run(
        [sys.executable, "-m", "kafka_delta_dev.broker", *args, "--state", str(state)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(SRC)),
        timeout=120,
        check=False,
    )


def _local_project(root: Path, cfg: PipelineConfig) -> Path:
    """A project folder whose conf/local.yaml names the template's default local address,
    127.0.0.1:9092, as a freshly generated project's does; returns the config's path."""
    document = cfg.model_dump(mode="json")
    document["kafka"]["bootstrap_servers"] = "127.0.0.1:9092"
    document["delta"]["table"] = "data/table"  # relative: resolved against the project root
    path = root / "conf" / "local.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(document))
    return path


def test_console_script_uses_the_broker_scripts_broker_sh_started_and_says_so(
    make_config, tmp_path, capsys
) -> None:
    from kafka_delta.commands.arguments import build_config
    from kafka_delta_dev.produce import ensure_topics

    project = tmp_path / "project"
    state = project / ".broker.json"
    project.mkdir()
    started = _broker_cli(state, "start")  # what `scripts/broker.sh start` runs
    assert started.returncode == 0, started.stderr
    address = started.stdout.strip()
    try:
        topic = "orders-local"
        ensure_topics(address, [topic], 1)
        produce_events(address, [topic], 10)
        cfg = make_config([topic]).with_overrides(
            **{"delta.table": str(project / "data" / "table")}
        )
        _sink_batches(cfg, [({}, {topic: {0: 10}})])
        conf = _local_project(project, cfg)

        # The README's quick start, then the console script with no address anywhere.
        shown = subprocess.run(
            [sys.executable, "-m", PACKAGE, "offsets", "show", "--json"],
            cwd=project,
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(SRC)),
            timeout=120,
            check=False,
        )
        assert shown.returncode == 0, (shown.stdout, shown.stderr)
        assert json.loads(shown.stdout)["stored"]["offsets"] == {topic: {"0": 10}}
        assert shown.stderr.splitlines() == [
            f"using the broker scripts/broker.sh started, at {address} ({state}; "
            "--bootstrap-servers overrides)"
        ]

        # --bootstrap-servers wins, silently; a config naming another address ignores the file.
        parse = parser("orders-stream offsets").parse_args
        capsys.readouterr()
        given = build_config(parse(["show", "--config", str(conf), "--bootstrap-servers", "h:1"]))
        assert given.kafka.bootstrap_servers == "h:1" and capsys.readouterr().err == ""
        other = _local_project(tmp_path / "other", cfg.with_overrides(pipeline_id="x"))
        other.write_text(other.read_text().replace("127.0.0.1:9092", "kafka.internal:9092"))
        (tmp_path / "other" / ".broker.json").write_text(state.read_text())
        chosen = build_config(parse(["show", "--config", str(other)]))
        assert chosen.kafka.bootstrap_servers == "kafka.internal:9092"
    finally:
        stopped = _broker_cli(state, "stop")
    assert stopped.returncode == 0, stopped.stderr

    # A state file left behind by a broker that is gone is ignored, and said so.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    state.write_text(json.dumps({"pid": int(dead.stdout), "bootstrap_servers": address}))
    capsys.readouterr()
    config = build_config(
        parser("orders-stream offsets").parse_args(["show", "--config", str(conf)])
    )
    assert config.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert "is no longer running; using kafka.bootstrap_servers 127.0.0.1:9092" in (
        capsys.readouterr().err
    )


# -- reset ------------------------------------------------------------------------------------


def _reset_args(*argv: str) -> argparse.Namespace:
    """``offsets reset`` arguments as the command's own parser reads them."""
    return parser("orders-stream offsets").parse_args(["reset", *argv])


def _newest(cfg: PipelineConfig):
    commit = newest_commit(DeltaTable(cfg.delta.table), cfg.pipeline_id)
    assert commit is not None
    return commit


def test_reset_each_way_is_one_audited_commit_with_txns_then_the_group(
    written, kafka_bootstrap, tmp_path, capsys
) -> None:
    cfg, topic = written
    parts = {topic: [0, 1]}
    table = DeltaTable(cfg.delta.table)
    version, seq = table.version(), _newest(cfg).record.seq
    produce_events(kafka_bootstrap, [topic], 20, first_id=80)  # latest is now 50 per partition

    # Without --execute (or with --dry-run): prints the change, writes nothing.
    for preview in ([], ["--dry-run"]):
        status, out, _ = _cli(cfg, tmp_path, capsys, "reset", "--to-latest", *preview)
        assert status == 0 and "preview: nothing written" in out
        rows = [line.split() for line in out.splitlines()]
        assert [topic, "0", "40", "50", "+10", "skips", "10", "unread"] in rows
        assert DeltaTable(cfg.delta.table).version() == version
        assert _group(cfg, parts) == {topic: {0: 40, 1: 40}}

    status, out, err = _cli(
        cfg,
        tmp_path,
        capsys,
        "reset",
        "--to-latest",
        "--reason",
        "skip",
        "--execute",
        "--allow-skip",
    )
    assert status == 0, err
    table = DeltaTable(cfg.delta.table)
    assert table.version() == version + 1  # ONE commit
    newest = _newest(cfg)
    assert newest.record.end_offsets == {topic: {0: 50, 1: 50}}
    assert newest.record.seq == seq + 1
    assert newest.record.reset is not None
    assert newest.record.reset["to"] == "latest" and newest.record.reset["reason"] == "skip"
    assert newest.record.reset["from"] == {topic: {"0": 40, "1": 40}}
    assert newest.record.reset["skip"] == [[topic, 0, 10], [topic, 1, 10]]
    assert table.history(1)[0]["operationMetrics"]["num_added_rows"] == 0  # no data
    assert table.transaction_version(f"{cfg.pipeline_id}:fence") == seq + 1
    assert table.transaction_version(f"{cfg.pipeline_id}:offset:{topic}:0") == 50
    assert table.transaction_version(newest.record.app_id) == 0
    assert _group(cfg, parts) == {topic: {0: 50, 1: 50}}
    assert "the checkpoint holds no batches" in out  # this checkpoint never ran

    # Explicit offsets: only the named partition moves, the other is carried.
    status, out, _ = _cli(
        cfg, tmp_path, capsys, "reset", "--to-offsets", f"{topic}:1=50", "--execute"
    )
    assert status == 0 and "already stores these offsets" in out
    assert DeltaTable(cfg.delta.table).version() == version + 1

    # Earliest and explicit backwards need --allow-rewind (see the next test); a datetime
    # before every record is earliest too. All records carry their produce time.
    status, out, err = _cli(
        cfg,
        tmp_path,
        capsys,
        "reset",
        "--to-datetime",
        "2000-01-01T00:00:00Z",
        "--allow-rewind",
        "--execute",
    )
    assert status == 0, err
    assert _newest(cfg).record.end_offsets == {topic: {0: 0, 1: 0}}
    assert _newest(cfg).record.reset["rewind"] == [[topic, 0], [topic, 1]]
    assert _group(cfg, parts) == {topic: {0: 0, 1: 0}}

    status, out, err = _cli(
        cfg,
        tmp_path,
        capsys,
        "reset",
        "--to-offsets",
        f"{topic}:0=7,{topic}:1=9",
        "--execute",
        "--allow-skip",
    )
    assert status == 0, err
    assert _newest(cfg).record.end_offsets == {topic: {0: 7, 1: 9}}
    status, out, err = _cli(
        cfg, tmp_path, capsys, "reset", "--to-earliest", "--allow-rewind", "--execute"
    )
    assert status == 0, err
    assert _newest(cfg).record.end_offsets == {topic: {0: 0, 1: 0}}
    assert DeltaTable(cfg.delta.table).version() == version + 4


def test_reset_to_a_datetime_finds_the_first_record_at_or_after_it(
    kafka_bootstrap, new_topics, make_config, tmp_path, capsys
) -> None:
    from confluent_kafka import Producer

    (topic,) = new_topics(1, partitions=1)
    # Record i is stamped base + i s. (Tansu 0.6 answers a time lookup on such records with
    # offset 0; the command checks the broker's answer against the records and searches them.)
    base = int(time.time() * 1000) - 3_600_000
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(20):
        producer.produce(topic, value=b"{}", partition=0, timestamp=base + i * 1000)
        producer.flush(30)
    cfg = make_config([topic])
    _sink_batches(cfg, [({}, {topic: {0: 4}})])
    run = ("--execute", "--allow-skip")
    status, _, err = _cli(cfg, tmp_path, capsys, "reset", "--to-datetime", str(base + 9_500), *run)
    assert status == 0, err
    assert _newest(cfg).record.end_offsets == {topic: {0: 10}}
    status, _, err = _cli(cfg, tmp_path, capsys, "reset", "--to-datetime", str(base + 10_000), *run)
    assert status == 0, err
    assert _newest(cfg).record.end_offsets == {topic: {0: 10}}  # at it: that record itself
    status, _, err = _cli(cfg, tmp_path, capsys, "reset", "--to-datetime", str(base + 60_000), *run)
    assert status == 0, err
    assert _newest(cfg).record.end_offsets == {topic: {0: 20}}  # after every record: latest


def test_reset_refuses_to_rewind_without_the_flag_and_writes_nothing(
    written, tmp_path, capsys
) -> None:
    cfg, topic = written
    version = DeltaTable(cfg.delta.table).version()
    status, out, err = _cli(
        cfg, tmp_path, capsys, "reset", "--to-offsets", f"{topic}:0=10", "--execute"
    )
    assert status == 2 and out == "" and err.count("error:") == 1
    assert "moves partitions backwards" in err and f"{topic}:0 40 -> 10" in err
    assert "Pass --allow-rewind" in err
    assert DeltaTable(cfg.delta.table).version() == version
    assert _group(cfg, {topic: [0, 1]}) == {topic: {0: 40, 1: 40}}


_HOLDER = """
import sys, time, yaml
sys.path.insert(0, {src!r})
from kafka_delta.config import PipelineConfig
from kafka_delta.recovery.lease import RunLease
cfg = PipelineConfig.model_validate(yaml.safe_load(open({conf!r})))
with RunLease.hold(cfg):
    print("held", flush=True)
    time.sleep(300)
"""


def test_reset_refuses_while_a_live_process_holds_the_run_lease(written, tmp_path, capsys) -> None:
    cfg, _ = written
    conf = _config_file(cfg, tmp_path)
    code = _HOLDER.format(src=str(SRC), conf=conf)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        version = DeltaTable(cfg.delta.table).version()
        status, _, err = _cli(
            cfg, tmp_path, capsys, "reset", "--to-earliest", "--allow-rewind", "--execute"
        )
        assert status == 2
        assert f"pid {holder.pid}" in err and "is running" in err and "Nothing was written" in err
        assert DeltaTable(cfg.delta.table).version() == version
        # A preview still shows the plan, and says the run is active.
        status, out, _ = _cli(
            cfg, tmp_path, capsys, "reset", "--to-earliest", "--allow-rewind", "--dry-run"
        )
        assert status == 0 and "note: pipeline" in out and "preview: nothing written" in out
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    # Killed without releasing: its lease file remains, but its process is gone on this host.
    assert [lease.pid for lease in read_leases(cfg.delta.table, cfg.pipeline_id)] == [holder.pid]
    status, _, err = _cli(
        cfg, tmp_path, capsys, "reset", "--to-earliest", "--allow-rewind", "--execute"
    )
    assert status == 0, err


def test_run_lease_heartbeats_and_leaves_nothing_behind(
    make_config, new_topics, monkeypatch
) -> None:
    from kafka_delta.recovery import lease as run_lease

    monkeypatch.setattr(run_lease, "HEARTBEAT_SECONDS", 0.1)
    cfg = make_config(new_topics(1, partitions=1))
    with RunLease.hold(cfg, lambda: "query-1") as lease:
        assert lease is not None
        (first,) = read_leases(cfg.delta.table, cfg.pipeline_id)
        assert (first.pid, first.checkpoint) == (os.getpid(), cfg.checkpoint)
        assert is_active(first)
        time.sleep(0.5)
        (later,) = read_leases(cfg.delta.table, cfg.pipeline_id)
        assert later.heartbeat_ms > first.heartbeat_ms and later.query_id == "query-1"
    assert read_leases(cfg.delta.table, cfg.pipeline_id) == []
    # A run that wrote no table leaves no folder; a table's own folder stays, lease-free.
    assert not Path(cfg.delta.table).exists()
    Path(cfg.delta.table).mkdir(parents=True)
    with RunLease.hold(cfg):
        pass
    assert Path(cfg.delta.table).is_dir() and not any(Path(cfg.delta.table).iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to-earliest", "--topic", "nope"], "unknown topic nope"),
        (["--to-offsets", "{topic}:7=1"], "partition 7 of topic {topic} is out of range"),
        (["--to-offsets", "{topic}:0=41"], "offset 41 of {topic}:0 is outside what Kafka holds"),
        (["--to-offsets", "{topic}0=41"], "is not TOPIC:PARTITION=OFFSET"),
        (["--to-offsets", "{topic}:0=-5"], "'{topic}:0=-5' has a negative offset"),
        (["--to-offsets", "{topic}:-1=5"], "'{topic}:-1=5' has a negative partition"),
        (["--to-datetime", "2999-01-01T00:00:00Z"], "is in the future"),
        (["--to-datetime", "yesterday"], "neither an ISO 8601 time"),
        (["--shift-by", "1"], "{topic}:0 shifted by +1 to 41 is outside what Kafka holds"),
        (["--shift-by", "-41"], "{topic}:0 shifted by -41 to -1 is outside what Kafka holds"),
        (["--by-duration", "P1M"], "is not an ISO 8601 duration"),
        (["--from-file", "/nonexistent.csv"], "--from-file: cannot read /nonexistent.csv"),
        (["--from-file", "/dev/null", "--topic", "x"], "--topic does not apply to --from-file"),
    ],
)
def test_reset_bad_input_gets_one_clear_error_and_writes_nothing(
    written, tmp_path, capsys, args, message
) -> None:
    cfg, topic = written
    version = DeltaTable(cfg.delta.table).version()
    argv = [a.format(topic=topic) for a in args]
    status, out, err = _cli(cfg, tmp_path, capsys, "reset", *argv)
    assert status == 2
    assert err.count("error:") == 1 and message.format(topic=topic) in err
    assert out == ""
    assert DeltaTable(cfg.delta.table).version() == version
    assert _group(cfg, {topic: [0, 1]}) == {topic: {0: 40, 1: 40}}


def test_reset_of_a_table_without_this_pipelines_commits_is_refused(
    written, tmp_path, capsys
) -> None:
    cfg, _ = written
    other = cfg.with_overrides(pipeline_id="another-pipeline")
    status, _, err = _cli(other, tmp_path, capsys, "reset", "--to-latest")
    assert status == 2 and "holds no commits of pipeline 'another-pipeline'" in err
    missing = cfg.with_overrides(**{"delta.table": str(tmp_path / "none")})
    status, _, err = _cli(missing, tmp_path, capsys, "reset", "--to-latest")
    assert status == 2 and "there is no Delta table at" in err


@pytest.mark.parametrize("racer", ["delta_rs", "delta_spark"])
def test_a_reset_and_a_pipeline_commit_racing_cannot_both_land(written, racer) -> None:
    from deltalake import CommitProperties, Transaction, write_deltalake

    from kafka_delta.offsets.model import fence_app_id

    cfg, topic = written
    table = DeltaTable(cfg.delta.table)
    args = _reset_args("--to-latest")
    plan = plan_reset(cfg, args, table, KafkaAdmin(cfg.kafka.client_config()))
    # The pipeline commits its next batch after the reset read the offsets.
    end = {topic: {0: 40, 1: 40}}
    if racer == "delta_rs":
        _sink_batches(cfg, [(end, end)], first_batch=2)
    else:  # delta-spark's writer: the batch's metadata and its one txn, the pipeline's fence
        batch = BatchCommit(cfg.pipeline_id, f"{cfg.pipeline_id}.q1", 2, end).on_top_of(plan.stored)
        write_deltalake(
            cfg.delta.table,
            _rows(5000, 0),
            mode="append",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(fence_app_id(cfg.pipeline_id), batch.seq)],
                custom_metadata={"userMetadata": batch.user_metadata()},
            ),
        )
    with pytest.raises(CommandError, match="the table changed while resetting"):
        commit_reset(table, cfg, plan, reason="race")
    assert _newest(cfg).record.reset is None and _newest(cfg).record.batch_id == 2


def test_a_run_the_lease_missed_cannot_commit_over_a_reset_and_is_told_why(written) -> None:
    from kafka_delta.offsets.fencing import FencingError

    cfg, topic = written
    table = DeltaTable(cfg.delta.table)
    args = _reset_args("--to-offsets", f"{topic}:0=10")
    plan = plan_reset(cfg, args, table, KafkaAdmin(cfg.kafka.client_config()))
    commit_reset(table, cfg, plan, reason="missed run")
    # The running pipeline's next batch starts where its checkpoint ended (40, 40).
    start = {topic: {0: 40, 1: 40}}
    with pytest.raises(FencingError, match="an operator reset the table's offsets"):
        _sink_batches(cfg, [(start, {topic: {0: 40, 1: 40}})], first_batch=2)
    assert _newest(cfg).record.reset is not None


def test_executing_a_forward_skip_needs_allow_skip_and_the_preview_names_the_flag(
    written, kafka_bootstrap, tmp_path, capsys
) -> None:
    cfg, topic = written
    version = DeltaTable(cfg.delta.table).version()
    produce_events(kafka_bootstrap, [topic], 20, first_id=80)  # latest is now 50 per partition

    status, out, _ = _cli(cfg, tmp_path, capsys, "reset", "--to-offsets", f"{topic}:0=45")
    assert status == 0
    assert "needs --allow-skip: the reset moves partitions forward past records not yet in" in out
    assert f"{topic}:0 40 -> 45: 5 records" in out
    assert out.splitlines()[-1] == (
        "preview: nothing written; to do it, run the same command with --execute --allow-skip"
    )

    status, out, err = _cli(
        cfg, tmp_path, capsys, "reset", "--to-offsets", f"{topic}:0=45", "--execute"
    )
    assert status == 2 and out == "" and err.count("error:") == 1 and len(err.splitlines()) == 1
    assert f"({topic}:0 40 -> 45: 5 records): they would never be read" in err
    assert err.rstrip().endswith("Nothing was written. Pass --allow-skip to do it anyway.")
    assert DeltaTable(cfg.delta.table).version() == version
    assert _group(cfg, {topic: [0, 1]}) == {topic: {0: 40, 1: 40}}

    # Both lossy directions at once name both flags, in one sentence.
    status, _, err = _cli(
        cfg, tmp_path, capsys, "reset", "--to-offsets", f"{topic}:0=45,{topic}:1=30", "--execute"
    )
    assert status == 2 and "Pass --allow-rewind --allow-skip to do it anyway" in err
    assert DeltaTable(cfg.delta.table).version() == version


def test_reset_shift_by_moves_each_stored_offset_relative_to_itself(
    written, tmp_path, capsys
) -> None:
    cfg, topic = written
    status, _, err = _cli(
        cfg, tmp_path, capsys, "reset", "--shift-by", "-15", "--allow-rewind", "--execute"
    )
    assert status == 0, err
    newest = _newest(cfg).record
    assert newest.end_offsets == {topic: {0: 25, 1: 25}} and newest.reset["to"] == "shift by -15"
    assert newest.reset["rewind"] == [[topic, 0], [topic, 1]]
    status, _, err = _cli(cfg, tmp_path, capsys, "reset", "--shift-by", "10", "--execute")
    assert status == 2 and "Pass --allow-skip" in err
    status, _, err = _cli(
        cfg, tmp_path, capsys, "reset", "--shift-by", "10", "--allow-skip", "--execute"
    )
    assert status == 0, err
    assert _newest(cfg).record.end_offsets == {topic: {0: 35, 1: 35}}
    assert _group(cfg, {topic: [0, 1]}) == {topic: {0: 35, 1: 35}}


def test_reset_shift_by_refuses_a_partition_with_no_stored_offset(
    kafka_bootstrap, new_topics, make_config, tmp_path, capsys
) -> None:
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 40)
    cfg = make_config([topic])
    _sink_batches(cfg, [({}, {topic: {0: 4}})])  # partition 1 never read
    status, out, err = _cli(cfg, tmp_path, capsys, "reset", "--shift-by", "1")
    assert status == 2 and out == ""
    assert f"--shift-by: {topic}:1 has no stored offset to start from" in err


def test_reset_by_duration_moves_to_the_first_record_of_now_minus_the_duration(
    kafka_bootstrap, new_topics, make_config, tmp_path, capsys
) -> None:
    from confluent_kafka import Producer

    (topic,) = new_topics(1, partitions=1)
    # Record i is stamped (20 - i) minutes ago: PT10M30S reaches back to record 10.
    now = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(20):
        producer.produce(topic, value=b"{}", partition=0, timestamp=now - (20 - i) * 60_000)
        producer.flush(30)
    cfg = make_config([topic])
    _sink_batches(cfg, [({}, {topic: {0: 4}})])
    status, _, err = _cli(
        cfg, tmp_path, capsys, "reset", "--by-duration", "PT10M30S", "--execute", "--allow-skip"
    )
    assert status == 0, err
    newest = _newest(cfg).record
    assert newest.end_offsets == {topic: {0: 10}}
    assert str(newest.reset["to"]).startswith("duration PT10M30S: datetime ")
    status, _, err = _cli(
        cfg, tmp_path, capsys, "reset", "--by-duration", "P1D", "--execute", "--allow-rewind"
    )
    assert status == 0, err
    assert _newest(cfg).record.end_offsets == {topic: {0: 0}}  # before every record: earliest


def test_parse_duration_reads_iso_8601_durations_and_refuses_months() -> None:
    assert parse_duration("PT1H") == 3_600_000
    assert parse_duration("pt30m") == 1_800_000
    assert parse_duration("P1DT2H") == 93_600_000
    assert parse_duration("P2W") == 14 * 86_400_000
    assert parse_duration("PT0.5S") == 500
    for bad in ("P1M", "P1Y", "PT", "P", "1h", "PT1H30", "-PT1H"):
        with pytest.raises(CommandError, match="is not an ISO 8601 duration"):
            parse_duration(bad)


def test_reset_to_current_rewrites_the_stored_offsets_as_an_audited_commit(
    written, tmp_path, capsys
) -> None:
    cfg, topic = written
    _push_group(cfg, {topic: {0: 3, 1: 5}})  # the group drifted from the table
    version = DeltaTable(cfg.delta.table).version()
    status, out, _ = _cli(cfg, tmp_path, capsys, "reset", "--to-current")
    assert status == 0 and "preview: nothing written" in out
    assert [topic, "0", "40", "40", "0"] in [line.split() for line in out.splitlines()]
    assert DeltaTable(cfg.delta.table).version() == version

    status, out, err = _cli(
        cfg, tmp_path, capsys, "reset", "--to-current", "--execute", "--reason", "audit"
    )
    assert status == 0, err
    assert DeltaTable(cfg.delta.table).version() == version + 1
    newest = _newest(cfg).record
    assert newest.end_offsets == {topic: {0: 40, 1: 40}}
    assert newest.reset["to"] == "current" and newest.reset["reason"] == "audit"
    assert newest.reset["from"] == {} and newest.reset["rewind"] == []
    assert _group(cfg, {topic: [0, 1]}) == {topic: {0: 40, 1: 40}}
    assert "sets checkpoint" not in out  # nothing moved: a checkpoint resumes as it is
    # A run that reads on from the stored offsets is not disturbed by it.
    _sink_batches(cfg, [({topic: {0: 40, 1: 40}}, {topic: {0: 40, 1: 40}})], first_batch=2)
    assert _newest(cfg).record.batch_id == 2


def test_show_csv_round_trips_through_reset_from_file(written, tmp_path, capsys) -> None:
    cfg, topic = written
    status, csv_text, _ = _cli(cfg, tmp_path, capsys, "show", "--csv")
    assert status == 0
    assert csv_text == f"{topic},0,40\n{topic},1,40\n"  # kafka-consumer-groups --export's rows
    saved = tmp_path / "offsets.csv"
    saved.write_text(csv_text)

    status, out, err = _cli(cfg, tmp_path, capsys, "reset", "--from-file", str(saved), "--execute")
    assert status == 0, err
    assert "already stores these offsets" in out
    status, _, err = _cli(
        cfg,
        tmp_path,
        capsys,
        "reset",
        "--to-offsets",
        f"{topic}:0=10,{topic}:1=20",
        "--execute",
        "--allow-rewind",
    )
    assert status == 0, err
    status, out, err = _cli(
        cfg, tmp_path, capsys, "reset", "--from-file", str(saved), "--execute", "--allow-skip"
    )
    assert status == 0, err
    newest = _newest(cfg).record
    assert newest.end_offsets == {topic: {0: 40, 1: 40}}
    assert newest.reset["to"] == f"file {saved}"
    assert _group(cfg, {topic: [0, 1]}) == {topic: {0: 40, 1: 40}}

    # A header row is allowed; partitions the file does not name keep their offsets.
    partial = tmp_path / "partial.csv"
    partial.write_text(f"topic,partition,offset\n{topic},1,30\n")
    status, _, err = _cli(
        cfg,
        tmp_path,
        capsys,
        "reset",
        "--from-file",
        str(partial),
        "--execute",
        "--allow-rewind",
    )
    assert status == 0, err
    assert _newest(cfg).record.end_offsets == {topic: {0: 40, 1: 30}}

    bad = tmp_path / "bad.csv"
    for text, message in [
        (f"{topic},0,15\n{topic},x,1\n", f"line 2: '{topic},x,1' is not TOPIC,PARTITION,OFFSET"),
        (f"{topic},0,15\n{topic},0,16\n", f"names {topic}:0 twice"),
        (f"{topic},0,-5\n", f"line 1: '{topic},0,-5' has a negative offset"),
        (f"{topic},0,41\n", f"offset 41 of {topic}:0 is outside what Kafka holds, [0, 40]"),
        ("\n", "holds no TOPIC,PARTITION,OFFSET rows"),
    ]:
        bad.write_text(text)
        version = DeltaTable(cfg.delta.table).version()
        status, out, err = _cli(cfg, tmp_path, capsys, "reset", "--from-file", str(bad))
        assert status == 2 and out == "" and err.count("error:") == 1
        assert message in err
        assert DeltaTable(cfg.delta.table).version() == version


def test_offsets_usage_names_the_console_script(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["offsets", "reset", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: kafka-delta offsets reset ")
    for flag in (
        "--execute",
        "--allow-skip",
        "--shift-by",
        "--by-duration",
        "--to-current",
        "--from-file",
    ):
        assert flag in out


def test_parse_when_reads_iso_and_epoch_ms_and_refuses_the_future() -> None:
    assert parse_when("1970-01-01T00:00:01Z") == 1000
    assert parse_when("1970-01-01T01:00:01+01:00") == 1000
    assert parse_when("1970-01-01T00:00:01") == 1000  # no zone: UTC
    assert parse_when("1234") == 1234
    with pytest.raises(CommandError, match="in the future"):
        parse_when("2000", now_ms=1999)


@pytest.mark.spark
def test_pipeline_sets_aside_a_checkpoint_older_than_a_reset_and_resumes_at_the_reset(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path, capsys
) -> None:
    from kafka_delta.pipeline import Pipeline

    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], 40)
    cfg = make_config([topic])
    Pipeline(spark, cfg).run()
    produce_events(kafka_bootstrap, [topic], 40, first_id=40)  # ids 40-79: skipped by the reset
    status, out, err = _cli(
        cfg,
        tmp_path,
        capsys,
        "reset",
        "--to-latest",
        "--reason",
        "skip",
        "--execute",
        "--allow-skip",
    )
    assert status == 0, err
    assert f"the next run sets checkpoint {cfg.checkpoint} aside" in out
    produce_events(kafka_bootstrap, [topic], 20, first_id=80)

    Pipeline(spark, cfg).run()
    assert list(Path(cfg.checkpoint).parent.glob(f"{Path(cfg.checkpoint).name}.set-aside-*"))

    ids = DeltaTable(cfg.delta.table).to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == [*range(40), *range(80, 100)]
    status, out, _ = _cli(cfg, tmp_path, capsys, "verify", "--ids", "id")
    assert status == 0, out
    assert "note  reset at version" in out and "(1 reset(s))" in out


# -- verify -----------------------------------------------------------------------------------


def test_verify_passes_on_a_whole_table(written, tmp_path, capsys) -> None:
    cfg, _ = written
    status, out, _ = _cli(cfg, tmp_path, capsys, "verify", "--ids", "id")
    assert status == 0, out
    assert out.splitlines()[-1] == "verify: OK"
    assert "2 commit(s) of the pipeline (0 reset(s)), 4 ranges over 2 partitions" in out


def test_verify_names_a_commit_whose_start_skips_offsets(
    kafka_bootstrap, new_topics, make_config, tmp_path, capsys
) -> None:
    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 40)
    cfg = make_config([topic])
    # Batch 1 claims to start at 25 although batch 0 ended at 20: offsets 20-24 never landed.
    # (The sink's own fencing check is what prevents this; a table restored from an older
    # copy, or written by a broken job, is what verify is for.)
    sink = DeltaRsSink(cfg.delta.table, cfg.pipeline_id)
    app = f"{cfg.pipeline_id}.q"
    sink.commit_batch(
        _rows(0, 20),
        BatchCommit(cfg.pipeline_id, app, 0, {topic: {0: 20}}).starting_at({topic: {0: 0}}),
    )
    sink.commit_batch(
        _rows(25, 15),
        BatchCommit(cfg.pipeline_id, app, 1, {topic: {0: 40}}).starting_at({topic: {0: 25}}),
    )
    _push_group(cfg, {topic: {0: 40}})
    status, out, _ = _cli(cfg, tmp_path, capsys, "verify")
    assert status == 1
    assert out.splitlines()[-1] == (
        f"verify: FAILED: ranges: {topic}:0: the commit at version 1 (batch 1 of {app}) starts "
        "at 25, but the pipeline's previous commit ended at 20: a gap of 5 offsets [20, 25) "
        "that no commit covers (records skipped)"
    )


def test_verify_names_an_overlap_and_a_batch_committed_twice(
    kafka_bootstrap, new_topics, make_config, tmp_path, capsys
) -> None:
    (topic,) = new_topics(1, partitions=1)
    produce_events(kafka_bootstrap, [topic], 40)
    cfg = make_config([topic])
    sink = DeltaRsSink(cfg.delta.table, cfg.pipeline_id)
    app = f"{cfg.pipeline_id}.q"
    sink.commit_batch(
        _rows(0, 30),
        BatchCommit(cfg.pipeline_id, app, 0, {topic: {0: 30}}).starting_at({topic: {0: 0}}),
    )
    sink.commit_batch(
        _rows(20, 20),
        BatchCommit(cfg.pipeline_id, f"{app}2", 0, {topic: {0: 40}}).starting_at({topic: {0: 20}}),
    )
    _push_group(cfg, {topic: {0: 40}})
    status, out, _ = _cli(cfg, tmp_path, capsys, "verify", "--ids", "id")
    assert status == 1
    assert "an overlap of 10 offsets [20, 30) (records written twice)" in out.splitlines()[-1]
    assert "FAIL  ids: 50 rows but 40 distinct values of id: 10 duplicate rows" in out


def test_verify_names_a_group_that_missed_its_commit(written, tmp_path, capsys) -> None:
    cfg, topic = written
    fresh = cfg.with_overrides(**{"kafka.consumer_group": cfg.kafka.consumer_group + "-new"})
    status, out, _ = _cli(fresh, tmp_path, capsys, "verify")
    assert status == 1
    assert out.splitlines()[-1].startswith(
        f"verify: FAILED: group: {topic}:0: consumer group {fresh.kafka.consumer_group} has "
        "no committed offset, the table stores 40"
    )


def test_verify_names_a_dead_letter_outside_the_committed_ranges(
    written, kafka_bootstrap, tmp_path, capsys
) -> None:
    from deltalake import write_deltalake

    cfg, topic = written

    def dead(partition: int, offset: int) -> pa.Table:
        return pa.table(
            {
                "topic": [topic],
                "partition": pa.array([partition], pa.int32()),
                "offset": pa.array([offset], pa.int64()),
                "error": ["bad"],
            }
        )

    write_deltalake(cfg.dead_letter_table, dead(0, 5))  # inside batch 0's [0, 20)
    write_deltalake(cfg.dead_letter_table, dead(1, 45), mode="append")  # its batch not in yet
    status, out, _ = _cli(cfg, tmp_path, capsys, "verify")
    assert status == 0, out
    assert "2 dead letters, all inside the committed ranges (1 beyond the stored offsets" in out

    # An operator skips 40-50 of partition 0; the pipeline then reads on from 50. A dead letter
    # at 45 (sent before a main commit that never came) lies in no committed range.
    produce_events(kafka_bootstrap, [topic], 40, first_id=80)  # latest 60 per partition
    status, _, err = _cli(
        cfg, tmp_path, capsys, "reset", "--to-offsets", f"{topic}:0=50", "--execute", "--allow-skip"
    )
    assert status == 0, err
    _sink_batches(cfg, [({topic: {0: 50, 1: 40}}, {topic: {0: 60, 1: 60}})], first_batch=2)
    _push_group(cfg, {topic: {0: 60, 1: 60}})
    write_deltalake(cfg.dead_letter_table, dead(0, 45), mode="append")
    status, out, _ = _cli(cfg, tmp_path, capsys, "verify")
    assert status == 1
    assert out.splitlines()[-1] == (
        f"verify: FAILED: dead letters: the dead letter at {topic}:0 offset 45 lies outside "
        "every range the pipeline committed (the table's offsets skipped it)"
    )
    assert f"{topic}:0 40 -> 50" in out  # the reset is listed as a note, not a problem
