"""The pipeline on a real Spark cluster: a standalone master and two workers of one core each,
started from pyspark's own jars on 127.0.0.1 (the ``spark_cluster`` fixture,
:mod:`kafka_delta_dev.standalone_cluster`), the runs submitted to it as a user submits them, with
the generated project's ``scripts/submit.sh``.

What a cluster changes and ``local[2]`` never shows:

- the master is the submitter's: the run reaches the cluster's master (it lists the
  application) although the config says ``local[2]``;
- the executors are other processes, which do not see the project's folder: they run a Python
  that has the engine's dependencies but neither the engine nor the project (``nodes_python``),
  from their own working folders, so the transform's UDF imports the user's package only from the
  wheel ``submit.sh`` ships;
- an executor can die mid-task (SIGKILL) and a whole worker with it, while the driver goes on:
  the tasks run again elsewhere, and the table stays exact. A failed attempt's Parquet files stay
  in the table's folder, in no commit; ``table maintain --full`` (VACUUM) removes them.

Tables and checkpoints are local paths: on one machine every executor sees them, as every node
of a real cluster sees HDFS or an object store.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from kafka_delta.config import load_config
from kafka_delta.runtime.connectors import DELTA_SESSION_CONFS, connector_packages
from kafka_delta_dev.children import die_with_parent
from kafka_delta_dev.produce import produce_events, produce_values
from kafka_delta_dev.pytest_plugin import JARS_DIR, WITH_CONNECTORS, connector_skip_reason
from support import (
    PROJECT,
    REPO,
    assert_exactly_once,
    assert_offsets_agree,
    forget_last_spark_commit,
)

pytestmark = [pytest.mark.spark, pytest.mark.broker]

# The user's package gains a helper module and a transform whose Python UDF calls it: the UDF's
# function is pickled by reference, so an executor must import orders_stream.enrich itself.
ENRICH = '''"""A helper of the user's package, called by the transform's UDF on the executors."""


def size_band(amount):
    if amount is None:
        return None
    return "large" if amount >= 250 else "small"
'''
UDF_TRANSFORM = '''"""The sample transform, and a column a Python UDF of the package computes."""

from kafka_delta import decoded_events
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from orders_stream import enrich


def transform(df: DataFrame) -> DataFrame:
    band = F.udf(enrich.size_band, "string")
    return decoded_events(df).withColumn("band", band(F.col("amount")))
'''
TRANSFORM = "orders_stream.udf_transform:transform"


@pytest.fixture(scope="module")
def nodes_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of the cluster's nodes: a virtual environment that sees this one's
    installed packages (pyspark, pyarrow, confluent-kafka, deltalake...) through a ``.pth``
    file, but neither the engine nor the project: this checkout reaches them through ``.pth``
    files of its own, which Python does not read in a folder another ``.pth`` adds."""
    where = tmp_path_factory.mktemp("nodes-python")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shared = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    Path(site, "_dependencies.pth").write_text("\n".join(shared) + "\n")
    probe = (
        "import importlib.util as u; import pyarrow, confluent_kafka, deltalake, pyspark; "
        "print([m for m in ('kafka_delta', 'orders_stream') if u.find_spec(m)])"
    )
    seen = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=where, env=_env()
    )
    assert seen.returncode == 0 and seen.stdout.strip() == "[]", seen.stdout + seen.stderr
    return str(python)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the generated project with the UDF transform, whose ``engine.txt`` names the
    engine's wheels built from this working tree (what submit.sh ships to the executors)."""
    root = tmp_path_factory.mktemp("cluster-project") / PROJECT.name
    shutil.copytree(PROJECT, root, ignore=shutil.ignore_patterns("data", "dist", "__pycache__"))
    (root / "src" / "orders_stream" / "enrich.py").write_text(ENRICH)
    (root / "src" / "orders_stream" / "udf_transform.py").write_text(UDF_TRANSFORM)
    wheels = root.parent / "engine-wheels"
    subprocess.run(
        [str(REPO / "scripts" / "engine-wheels"), str(wheels)],
        check=True,
        capture_output=True,
        env=_env(),
    )
    (root / "engine.txt").write_text(f"--find-links {wheels}\n")
    return root


def _env(**extra: str) -> dict[str, str]:
    """A user's shell: this environment's interpreter first on PATH, nothing of the test
    session's Python path or Spark settings."""
    drop = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_REMOTE", "MASTER")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("KAFKA_DELTA")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        **extra,
    )
    return env


def _config(tmp_path: Path, bootstrap: str, topics: list[str], engine: str, **kafka) -> Path:
    conf = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text(encoding="utf-8"))
    conf["engine"] = engine
    conf["transform"] = TRANSFORM
    conf["kafka"].update(
        bootstrap_servers=bootstrap,
        topics=topics,
        consumer_group=f"g-{uuid.uuid4().hex[:10]}",
        **kafka,
    )
    conf["delta"]["table"] = str(tmp_path / "table")
    conf["dead_letters"]["table"] = str(tmp_path / "dead_letters")
    conf["checkpoint"] = str(tmp_path / "checkpoint")
    conf["progress"]["path"] = str(tmp_path / "progress.jsonl")
    conf["decoding"]["value"]["schema_file"] = str(PROJECT / "schemas" / "order_event.ddl")
    conf["trigger"]["interval_seconds"] = 1
    path = tmp_path / "conf" / "cluster.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(conf), encoding="utf-8")
    return path


def _submit(
    project: Path,
    master: str,
    python: str,
    config: Path,
    *args: str,
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> subprocess.Popen[str]:
    """``scripts/submit.sh`` as a user runs it, in a session of its own (a crash point kills
    that session's process group); its output to ``log``."""
    out = open(log, "w") if log else subprocess.PIPE
    return subprocess.Popen(
        [
            str(project / "scripts" / "submit.sh"),
            "--master",
            master,
            "--python",
            python,
            "--config",
            str(config),
            *args,
        ],
        cwd=project,
        env=env or _env(),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent,  # a test session killed hard stops its run too
    )


def _finish(run: subprocess.Popen[str], timeout: float = 420) -> str:
    try:
        out, _ = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        out, _ = run.communicate()
        raise AssertionError(f"the run did not end within {timeout:.0f}s:\n{out[-4000:]}") from None
    return out or ""


def _connectors() -> dict[str, str]:
    """How submit.sh gets the cluster engine's jars here (they go to the executors with the
    application): the folder of them, or Spark fetching them; else the test skips, naming the
    connectors this machine lacks."""
    if JARS_DIR and any(Path(JARS_DIR).glob("spark-sql-kafka*.jar")):
        return {"KAFKA_DELTA_JARS": JARS_DIR}
    if WITH_CONNECTORS:
        confs = " ".join(f"--conf {k}={v}" for k, v in DELTA_SESSION_CONFS.items())
        return {"SPARK_SUBMIT_EXTRA": f"--packages {','.join(connector_packages())} {confs}"}
    pytest.skip(
        connector_skip_reason(
            ["spark-sql-kafka"] if JARS_DIR else ["delta-spark", "spark-sql-kafka"]
        )
    )


def _bad_values(bootstrap: str, topic: str, partitions: int, tag: str, count: int) -> list[bytes]:
    """``count`` undecodable values (each one distinct) over the topic's partitions."""
    values = [f"not json {tag}-{i}".encode() for i in range(count)]
    produce_values(bootstrap, topic, [(i % partitions, v) for i, v in enumerate(values)])
    return values


def _assert_dead_letters(config: Path, bad: list[bytes]) -> None:
    """Every bad record is in the dead-letter table once, by its position and its bytes."""
    dead = DeltaTable(load_config(config).dead_letter_table).to_pyarrow_table()
    positions = list(
        zip(*(dead[c].to_pylist() for c in ("topic", "partition", "offset")), strict=True)
    )
    assert len(set(positions)) == len(positions), Counter(positions).most_common(3)
    assert sorted(dead["value"].to_pylist()) == sorted(bad)


def _landed(cfg) -> tuple[int, int]:
    """(rows, dead letters) the tables hold now."""
    counts = []
    for uri in (cfg.delta.table, cfg.dead_letter_table):
        try:
            counts.append(DeltaTable(uri).count())
        except TableNotFoundError:
            counts.append(0)
    return counts[0], counts[1]


def _assert_udf_ran(config: Path) -> None:
    table = DeltaTable(load_config(config).delta.table).to_pyarrow_table(columns=["amount", "band"])
    expected = ["large" if a >= 250 else "small" for a in table["amount"].to_pylist()]
    assert table["band"].to_pylist() == expected


def _apps(spark_cluster, name_part: str) -> list[dict]:
    return [a for a in spark_cluster.applications() if name_part in a.get("name", "")]


# -- the contract on the cluster ---------------------------------------------------------------


def test_the_cluster_engine_on_the_cluster_lands_records_exactly_once_through_a_crash(
    spark_cluster, kafka_bootstrap, new_topics, project: Path, tmp_path: Path
) -> None:
    """The cluster engine (Spark's kafka source and delta-spark, their jars shipped with
    --jars), submitted with scripts/submit.sh: the run goes to the cluster's master (the config
    says local[2]); the UDF transform runs on executors that import the user's package only from
    the shipped wheel; a driver killed after a batch's Delta commit (before Spark's) replays that
    batch as a no-op on restart; dead letters land once; the consumer group holds the stored
    offsets (lag 0). The embedded engine's turn is the next test's."""
    engine = "cluster"
    extra = _connectors()
    # The nodes' Python at this interpreter's own path (as on nodes of one image): it must reach
    # the executors as named, never as this machine's launcher of it (a file in this machine's
    # cache). It has the engine (a .pth of this checkout), not the project.
    python = sys.executable
    topics = new_topics(2, partitions=2)
    produce_events(kafka_bootstrap, topics, 2000)
    bad = _bad_values(kafka_bootstrap, topics[0], 2, engine, 6)
    config = _config(tmp_path, kafka_bootstrap, topics, engine, max_records_per_trigger=1000)
    cfg = load_config(config)

    crashed = _submit(
        project,
        spark_cluster.master_url,
        python,
        config,
        env=_env(KAFKA_DELTA_CRASH_AT="after_delta_commit", **extra),
    )
    out = _finish(crashed)
    assert crashed.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), out[-4000:]
    assert "done:" not in out, out[-4000:]
    version = DeltaTable(cfg.delta.table).version()

    rerun = _submit(project, spark_cluster.master_url, python, config, env=_env(**extra))
    out = _finish(rerun)
    assert rerun.returncode == 0, out[-4000:]
    # The submitter's master, though the config says local[2], and the Python it named.
    assert f"spark: master {spark_cluster.master_url}, executors' Python {python}\n" in out
    done = re.search(r"done: batches=(\d+) replayed=(\d+) rows=(\d+)", out)
    assert done and done.group(2) == "1", out[-4000:]  # the killed batch: a replay, no write
    assert DeltaTable(cfg.delta.table).history(1)[0]["version"] > version
    assert_exactly_once(cfg, 2000)
    _assert_dead_letters(config, bad)
    _assert_udf_ran(config)
    assert_offsets_agree(cfg)  # stored == planned == group committed == latest: lag 0
    assert len(_apps(spark_cluster, cfg.pipeline_id)) >= 2  # both runs reached the master


# -- executors and a worker killed while batches run ---------------------------------------------


class Producer:
    """Keeps producing order events (and a few undecodable records) to the topics in a
    background thread until stopped: every micro-batch of a continuous run has work."""

    def __init__(self, bootstrap: str, topics: list[str], partitions: int) -> None:
        self.bootstrap, self.topics, self.partitions = bootstrap, topics, partitions
        self.produced = 0
        self.bad: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                produce_events(self.bootstrap, self.topics, 400, first_id=self.produced)
                self.produced += 400
                tag = f"{len(self.bad)}"
                self.bad += _bad_values(self.bootstrap, self.topics[0], self.partitions, tag, 1)
                self._stop.wait(1.0)
        except BaseException as exc:  # reported by the test
            self.error = exc

    def start(self) -> Producer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert self.error is None, self.error


def _lost_tasks(log: Path) -> list[str]:
    """The tasks Spark's driver says an executor's death lost."""
    return re.findall(r"Lost task .*ExecutorLostFailure", log.read_text(errors="replace"))


def _batches(log: Path) -> list[str]:
    return re.findall(r"\bbatch=\d+ .*", log.read_text(errors="replace"))


def _wait(condition, run: subprocess.Popen[str], log: Path, what: str, timeout: float = 240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.poll() is not None:
            raise AssertionError(f"the run ended waiting for {what}:\n{log.read_text()[-4000:]}")
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout:.0f}s:\n{log.read_text()[-4000:]}")


def _kill_mid_task(cluster, rng: random.Random, timeout: float = 120) -> int | None:
    """SIGKILL an executor while it runs a task that has run a moment already (reading,
    decoding, transforming): its pid, or None when none ran one in ``timeout``. The other
    executor, or the one its worker starts in its place, runs the task again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(cluster.running_tasks().values()):
            time.sleep(rng.uniform(0.2, 0.8))
            busy = [pid for pid, tasks in cluster.running_tasks().items() if tasks]
            if busy:
                victim = rng.choice(busy)
                os.kill(victim, signal.SIGKILL)
                return victim
        time.sleep(0.05)
    return None


def _kill_as_a_file_appears(cluster, table: Path, timeout: float = 120) -> list[int]:
    """SIGKILL the executors running a task the moment a new data file appears in the table's
    folder (a task writing its Parquet file, its result not yet the driver's): their pids."""
    known = {p.name for p in table.glob("*.parquet")}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if {p.name for p in table.glob("*.parquet")} - known:
            busy = [pid for pid, tasks in cluster.running_tasks().items() if tasks]
            for pid in busy:
                os.kill(pid, signal.SIGKILL)
            if busy:
                return busy
            known = {p.name for p in table.glob("*.parquet")}
        time.sleep(0.002)
    return []


def _orphans(table: Path) -> set[str]:
    """Parquet files in the table's folder that no version of its log ever added: the files
    of task attempts that died (the log's JSON commits are all kept at this age)."""
    added: set[str] = set()
    for commit in (table / "_delta_log").glob("*.json"):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                added.add(action["add"]["path"])
    on_disk = {
        str(p.relative_to(table))
        for p in table.rglob("*.parquet")
        if not any(part.startswith("_") for part in p.relative_to(table).parts)
    }
    live = {Path(uri).name for uri in DeltaTable(str(table)).file_uris()}
    assert live <= {Path(p).name for p in added}
    return on_disk - added


def test_executors_sigkilled_mid_task_and_a_worker_killed_and_restarted_leave_the_table_exact(
    spark_cluster, kafka_bootstrap, new_topics, nodes_python: str, project: Path, tmp_path: Path
) -> None:
    """The embedded engine on the cluster, its executors' Python without the engine or the
    project (both reach them as the wheels scripts/submit.sh ships). A continuous run while
    records arrive: an executor SIGKILLed during a batch, at least five times, then a whole
    worker SIGKILLed and started again. Spark runs the lost tasks again; the table, the dead
    letters and the group's offsets end exact. Then the state a driver killed past a batch's
    Delta commit leaves: the next run replays that batch as a no-op. The dead attempts'
    Parquet files stay in the table's folder, in no commit, until ``table maintain --full``
    (VACUUM FULL) deletes them once they are older than the retention."""
    topics = new_topics(2, partitions=2)
    config = _config(tmp_path, kafka_bootstrap, topics, "embedded", max_records_per_trigger=3000)
    cfg = load_config(config)
    table = Path(cfg.delta.table)
    producer = Producer(kafka_bootstrap, topics, 2).start()
    log = tmp_path / "run.log"
    run = _submit(
        project,
        spark_cluster.master_url,
        nodes_python,
        config,
        "--trigger",
        "processing-time",
        log=log,
    )
    rng = random.Random(45)
    kills: list[int] = []
    try:
        _wait(lambda: len(_batches(log)) >= 1, run, log, "a first batch")
        # Until five tasks were lost to the kills (a kill can land as its task just ended).
        while len(_lost_tasks(log)) < 5 and len(kills) < 12:
            seen = len(_batches(log))
            killed = _kill_mid_task(spark_cluster, rng)
            assert killed is not None, f"no task ran: {log.read_text()[-4000:]}"
            kills.append(killed)
            # The next kill in a later batch: the lost tasks ran again and the batch committed.
            _wait(lambda n=seen: len(_batches(log)) > n, run, log, "the next batch")
        # A task writes its Parquet file at its end (it opens one per 128k rows): the kills
        # above hit tasks still reading. Now executors die as a task's file appears, until a
        # dead attempt's file is left behind.
        for _ in range(8):
            if _orphans(table):
                break
            seen = len(_batches(log))
            kills += _kill_as_a_file_appears(spark_cluster, table)
            _wait(lambda n=seen: len(_batches(log)) > n, run, log, "the next batch")
        seen = len(_batches(log))
        spark_cluster.kill_worker(1)
        _wait(lambda: len(_batches(log)) >= seen + 2, run, log, "two batches on one worker")
        spark_cluster.start_worker(1)
        _wait(lambda: len(spark_cluster.executor_pids(1)) == 1, run, log, "worker 1's executor")
        seen = len(_batches(log))
        _wait(lambda: len(_batches(log)) >= seen + 2, run, log, "two batches on both workers")
        producer.stop()
        # Caught up: everything produced has landed (a batch's "behind_latest=0" may predate the
        # producer's last records, and the run would stop before reading them).
        landed = (producer.produced, len(producer.bad))
        _wait(
            lambda: all(n >= m for n, m in zip(_landed(cfg), landed, strict=True)),
            run,
            log,
            "every record landed",
        )
        run.send_signal(signal.SIGTERM)  # a clean stop after the current micro-batch
        assert run.wait(timeout=180) == 0, log.read_text()[-4000:]
    finally:
        producer._stop.set()
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    out = log.read_text(errors="replace")
    lost = _lost_tasks(log)
    # Five kills at least (the orphan hunt adds none when those five already left a file).
    assert len(kills) >= 5 and len(lost) >= 5, (kills, lost, out[-4000:])
    assert f"spark: master {spark_cluster.master_url}, executors' Python {nodes_python}\n" in out
    assert_exactly_once(cfg, producer.produced)
    _assert_dead_letters(config, producer.bad)
    assert_offsets_agree(cfg)  # lag 0

    # A driver killed after the last batch's Delta commit, before Spark's: the next run (until
    # caught up, as a scheduled job) replays that batch and writes nothing of it again.
    forget_last_spark_commit(cfg)
    produced = producer.produced + produce_events(
        kafka_bootstrap, topics, 300, first_id=producer.produced
    )
    bad = producer.bad + _bad_values(kafka_bootstrap, topics[0], 2, "after", 2)
    rerun = _submit(project, spark_cluster.master_url, nodes_python, config)
    out = _finish(rerun)
    assert rerun.returncode == 0, out[-4000:]
    done = re.search(r"done: batches=(\d+) replayed=(\d+) rows=(\d+)", out)
    assert done and done.group(2) == "1" and done.group(3) == "300", out[-4000:]
    assert_exactly_once(cfg, produced)
    _assert_dead_letters(config, bad)
    _assert_udf_ran(config)
    assert_offsets_agree(cfg)  # lag 0

    orphans = _orphans(table)
    print(
        f"cluster kills: {len(kills)} executors SIGKILLed, {len(lost)} tasks lost, "
        f"{len(_batches(log))} batches, {produced} records, "
        f"{len(orphans)} orphan Parquet files in no commit"
    )
    assert orphans, "no dead attempt left a file: the kills hit no write"
    # VACUUM FULL deletes files no commit names once older than the retention (7 days).
    old = time.time() - 8 * 86400
    for name in orphans:
        os.utime(table / name, (old, old))
    maintain = ["table", "maintain", "--full", "--config", str(config)]
    maintained = subprocess.run(
        [sys.executable, "-m", "orders_stream", *maintain],
        cwd=project,
        env=_env(PYTHONPATH=str(project / "src")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert maintained.returncode == 0, maintained.stdout + maintained.stderr
    assert not _orphans(table), maintained.stdout
    assert_exactly_once(cfg, produced)
