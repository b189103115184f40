"""A clean stop (graceful_stop.py), with real processes and real signals: SIGTERM or Ctrl-C
while a micro-batch runs finishes that batch (Delta commit, then commit-back), stops the query
and exits 0, with nothing alarming in the output; a second signal stops at once, and the next
run still leaves every record exactly once.

Each run is the project's own entry point on a copy of the project whose transform sleeps in
every read task (a user's slow transform), so that a batch is surely running when the signal
comes. The ways users send signals: ``kill <pid>`` of what they started (``scripts/run_local.sh``
execs spark-submit, so that is Spark's JVM, the Python driver's parent), Ctrl-C in a terminal
(SIGINT to the whole foreground process group) and a SIGTERM to the process group (what
systemd and docker do to a process tree)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from conftest import STANDIN
from kafka_delta.config import PipelineConfig, load_config
from kafka_delta.delta.rs_offset_store import DeltaRsOffsetStore
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.pipeline import Pipeline
from kafka_delta.runtime.graceful_stop import StopGate, StopInProgress, StopSignals
from kafka_delta_dev.produce import produce_events
from support import PACKAGE, PROJECT, assert_exactly_once, assert_offsets_agree

RECORDS = 3000
PER_BATCH = 1000
SLOW_SECONDS = 4.0

# Appended to the copy's transform.py: every read task of a batch sleeps before passing its
# records on, and leaves a mark when it starts.
SLOW_TRANSFORM = """

# --- tests/test_graceful_stop.py: a slow transform, so that a batch is running when signalled
import os as _os
import time as _time
from pathlib import Path as _Path

_fast_transform = transform


def _slow(batches):
    _Path(_os.environ["SLOW_MARKS"], f"{_os.getpid()}-{_time.time_ns()}").touch()
    _time.sleep(float(_os.environ["SLOW_SECONDS"]))
    yield from batches


def transform(df):
    return _fast_transform(df.mapInArrow(_slow, df.schema))
"""


def _slow_project(
    tmp_path: Path, bootstrap: str, topic: str, engine: dict[str, str] | None = None
) -> tuple[Path, Path]:
    """A copy of this project (src, scripts, conf, schemas) with the slow transform, and its
    config (``engine``: another than conf/local.yaml's)."""
    root = tmp_path / "project"
    for part in ("src", "scripts", "conf", "schemas"):
        shutil.copytree(PROJECT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    with (root / "src" / PACKAGE / "transform.py").open("a", encoding="utf-8") as out:
        out.write(SLOW_TRANSFORM)
    conf = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text(encoding="utf-8"))
    conf["kafka"].update(
        bootstrap_servers=bootstrap,
        topics=[topic],
        consumer_group=f"g-{uuid.uuid4().hex[:10]}",
        max_records_per_trigger=PER_BATCH,
    )
    conf["delta"]["table"] = str(tmp_path / "table")
    conf["dead_letters"]["table"] = str(tmp_path / "dead_letters")
    conf["checkpoint"] = str(tmp_path / "checkpoint")
    conf["trigger"] = {"mode": "processing_time", "interval_seconds": 1}
    if engine is not None:
        conf["engine"] = engine
    config = root / "conf" / "stop.yaml"
    config.write_text(yaml.safe_dump(conf), encoding="utf-8")
    return root, config


def _start(root: Path, config: Path, launcher: str, marks: Path, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_DELTA_", "PYTHONPATH"))}
    env.update(
        PYSPARK_PYTHON=sys.executable,
        SLOW_MARKS=str(marks),
        SLOW_SECONDS=str(SLOW_SECONDS),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    if launcher == "spark-submit":
        command = [str(root / "scripts" / "run_local.sh"), "--config", str(config)]
    else:
        env["PYTHONPATH"] = str(root / "src")
        command = [sys.executable, "-m", PACKAGE, "--config", str(config)]
    return subprocess.Popen(
        command,
        cwd=root,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a process group of its own, as a terminal or systemd gives it
    )


def _wait_for(condition, proc: subprocess.Popen, log: Path, what: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"exited {proc.returncode} before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f}s:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def _run_until_batch_1_runs(proc: subprocess.Popen, log: Path, marks: Path) -> None:
    """Returns while batch 1 runs: batch 0 is committed and batch 1's read tasks sleep."""
    _wait_for(lambda: "batch=0 " in log.read_text(), proc, log, "batch 0")
    seen = {p.name for p in marks.iterdir()}
    _wait_for(lambda: {p.name for p in marks.iterdir()} - seen, proc, log, "batch 1 running")
    time.sleep(1.0)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _assert_clean(text: str) -> None:
    for alarming in (
        "Traceback",
        "StackOverflowError",
        "Exception",
        "CANCELLED",
        "exited unexpectedly",
        " ERROR ",
        "CONFWARN",
        "ResolveWriteToStream",
        "Failed to cancel job group",
    ):
        assert alarming not in text, f"{alarming!r} in the output:\n{text[-4000:]}"


def _assert_committed_batches_exactly_once(config: PipelineConfig, last_batch: int) -> None:
    """The table holds batches 0..last_batch, each record once; the group's offsets are the
    table's; Spark's checkpoint recorded the last batch (the next run does not replay it)."""
    admin = KafkaAdmin(config.kafka.client_config())
    partitions = admin.partitions(config.kafka.topics)
    stored = DeltaRsOffsetStore(config.delta.table, config.pipeline_id).read(lambda: partitions)
    assert stored is not None and stored.batch_id == last_batch
    table = DeltaTable(config.delta.table).to_pyarrow_table()
    columns = [table[c].to_pylist() for c in ("topic", "partition", "offset")]
    positions = sorted(zip(*columns, strict=True))
    expected = sorted(
        (t, p, o)
        for t, parts in stored.offsets.items()
        for p, end in parts.items()
        for o in range(end)
    )
    assert positions == expected  # every record below the stored offsets, once
    assert len(positions) == (last_batch + 1) * PER_BATCH
    assert admin.committed(config.kafka.consumer_group, partitions) == stored.offsets
    assert (Path(config.checkpoint) / "commits" / str(last_batch)).is_file()


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.parametrize(
    ("launcher", "target", "signum", "source"),
    [
        ("spark-submit", "pid", signal.SIGTERM, None),  # kill <pid>: Spark's JVM forwards it
        ("python -m", "group", signal.SIGINT, None),  # Ctrl-C in a terminal
        ("spark-submit", "group", signal.SIGTERM, None),  # systemd, docker: JVM and driver
        # The cluster path's driver, on the stand-in of Spark's kafka source.
        ("python -m", "group", signal.SIGTERM, STANDIN),
    ],
    ids=[
        "spark-submit-kill-pid",
        "python-ctrl-c",
        "spark-submit-group-sigterm",
        "spark-kafka-standin-group-sigterm",
    ],
)
def test_a_signal_during_a_batch_finishes_it_stops_and_exits_0(
    kafka_bootstrap,
    new_topics,
    tmp_path: Path,
    launcher: str,
    target: str,
    signum: int,
    source: str | None,
) -> None:
    if launcher == "spark-submit" and not (Path(sys.executable).parent / "spark-submit").exists():
        pytest.skip("spark-submit is not next to this interpreter (pyspark installs it there)")
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], RECORDS)
    engine = None if source is None else {"source": source, "sink": "delta_rs"}
    root, config_path = _slow_project(tmp_path, kafka_bootstrap, topic, engine)
    marks, log = tmp_path / "marks", tmp_path / "run.log"
    marks.mkdir()
    proc = _start(root, config_path, launcher, marks, log)
    try:
        _run_until_batch_1_runs(proc, log, marks)
        signalled = time.monotonic()
        if target == "group":
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        code = proc.wait(timeout=120)
        took = time.monotonic() - signalled
    finally:
        _kill_group(proc)

    text = log.read_text()
    assert code == 0, text[-4000:]
    print(f"{launcher} {target} {signal.Signals(signum).name}: exit 0 {took:.1f}s after the signal")
    # The batch running when the signal came finished; none after it started.
    assert "batch=1 " in text and "batch=2 " not in text, text[-4000:]
    assert "stopping the query after batch 1" in text
    _assert_clean(text)
    if launcher == "spark-submit":
        assert "incubator" not in text
    # at most the rest of the sleeping batch, its commit and the shutdown
    assert took < SLOW_SECONDS + 20, took
    _assert_committed_batches_exactly_once(load_config(config_path), last_batch=1)


@pytest.mark.spark
@pytest.mark.broker
def test_a_second_signal_stops_at_once_and_the_next_run_loses_and_duplicates_nothing(
    spark, kafka_bootstrap, new_topics, tmp_path: Path
) -> None:
    (topic,) = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, [topic], RECORDS)
    root, config_path = _slow_project(tmp_path, kafka_bootstrap, topic)
    marks, log = tmp_path / "marks", tmp_path / "run.log"
    marks.mkdir()
    proc = _start(root, config_path, "python -m", marks, log)
    try:
        _run_until_batch_1_runs(proc, log, marks)
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - signalled
    finally:
        _kill_group(proc)

    text = log.read_text()
    assert code == 128 + signal.SIGTERM, text[-4000:]
    assert "SIGTERM again: stopping now" in text
    assert took < 5, took  # not waiting for the batch (SLOW_SECONDS) to end
    assert "batch=1 " not in text

    # The interrupted batch is replayed by the next run (its txn keeps it from writing twice).
    config = load_config(config_path).with_overrides(**{"trigger.mode": "available_now"})
    Pipeline(spark, config).run()
    assert_exactly_once(config, RECORDS)
    assert_offsets_agree(config)


# -- the decisions alone ----------------------------------------------------------------------


class _Query:
    """Stands in for a StreamingQuery: what StopGate reads of it, and whether it was stopped."""

    def __init__(self) -> None:
        self.lastProgress: dict[str, int] | None = None
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


def test_the_query_is_stopped_only_between_batches_once_spark_recorded_the_last_one() -> None:
    gate, query = StopGate(), _Query()
    gate.enter()
    gate.request()
    assert not gate.stop_when_safe(query)  # the batch in progress runs to its end
    gate.leave(4, succeeded=True)
    query.lastProgress = {"batchId": 3}
    assert not gate.stop_when_safe(query)  # Spark is still writing batch 4's commit log
    query.lastProgress = {"batchId": 4}
    assert gate.stop_when_safe(query) and query.stopped == 1
    assert gate.stop_when_safe(query) and query.stopped == 1  # once

    # A batch Spark planned in the instant before stop() took effect writes nothing.
    with pytest.raises(StopInProgress) as refused:
        gate.enter()
    assert StopGate.stopped_by_gate(refused.value)


def test_with_no_batch_finished_the_query_stops_at_once() -> None:
    gate, query = StopGate(), _Query()
    gate.request()
    assert gate.stop_when_safe(query) and query.stopped == 1


def test_a_signal_that_reaches_the_driver_and_the_jvm_counts_once() -> None:
    stops: list[int] = []
    with StopSignals(lambda: stops.append(1)) as signals:
        os.kill(os.getpid(), signal.SIGTERM)  # a process-group signal reaches the driver...
        signals._jvm_handler(signal.SIGTERM)  # ...and the JVM, which forwards it
        time.sleep(0.1)
    assert stops == [1]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


_PLANNER_END = """
import socket
from pyspark.serializers import read_int, write_int
from kafka_delta.runtime.graceful_stop import ignore_stop_signals_in_spark_helper
ignore_stop_signals_in_spark_helper()
ours, jvm = socket.socketpair()
sock_file = ours.makefile("rwb", 65536)
jvm.close()  # the query stopped: the JVM's end of the planner's socket goes away
try:
    read_int(sock_file)  # pyspark's runner, waiting for its next call
except BaseException:
    {failure}
"""


@pytest.mark.parametrize(
    ("failure", "quiet"),
    [
        ("write_int(-2, sock_file); sock_file.flush()", True),  # what pyspark's runner does
        ("raise ValueError('a real failure of the planner')", False),
    ],
    ids=["socket-closed", "other-failure"],
)
def test_the_planner_ends_quietly_when_spark_closes_its_socket_and_loudly_otherwise(
    failure: str, quiet: bool
) -> None:
    """A process-group SIGTERM run's output once showed half a traceback of pyspark's
    streaming source runner: the JVM closed its socket at the stop, the runner's reply to that
    raised BrokenPipeError at top level. The planner's end must say nothing; any other
    failure must still print in full."""
    code = _PLANNER_END.format(failure=failure)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    if quiet:
        assert done.stderr == ""
    else:
        assert "Traceback" in done.stderr and "a real failure of the planner" in done.stderr
