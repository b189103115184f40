"""What the engine's suites share: a project generated from the template (its conf, schemas and
scripts, for tests of what a project holds), and assertions that read tables with delta-rs and
Kafka with confluent-kafka directly: an independent check of whatever engine wrote the table."""

from __future__ import annotations

import atexit
import functools
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from deltalake import DeltaTable

from kafka_delta.config import PipelineConfig, load_config
from kafka_delta.delta.rs_offset_store import DeltaRsOffsetStore
from kafka_delta.kafka.admin import KafkaAdmin, total_lag
from kafka_delta.recovery.checkpoint import CheckpointLog

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
# The default project's package (conf/embedded-local.yaml), which its conf/*.yaml name.
PACKAGE = "orders_stream"


class RunInThread:
    """A pipeline's ``run()`` in a daemon thread of this process, as a continuous run goes on
    while the test produces and looks; what it raised is kept in ``failures``."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.pipeline.run()
        except BaseException as exc:
            self.failures.append(exc)

    def start(self) -> RunInThread:
        self.thread.start()
        return self

    def wait_until(
        self, condition: Callable[[], bool], what: str, timeout: float = 120, every: float = 0.1
    ) -> None:
        """Until ``condition()``; fails at once if the run failed, or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not condition():
            assert not self.failures, self.failures
            assert time.monotonic() < deadline, what
            time.sleep(every)

    def stop(self, timeout: float = 120) -> None:
        """Ask the run to stop after its batch, and wait for it."""
        self.pipeline.request_stop()
        self.thread.join(timeout)


@functools.cache
def rendered_project() -> Path:
    """The template rendered once for this test process with the default preset: the project a
    user generates, for tests that read its conf, schemas or scripts, or run it as a process
    (its src/ holds the user's package beside its copy of the engine)."""
    from cookiecutter.main import cookiecutter

    where = Path(tempfile.mkdtemp(prefix="kafka-delta-project-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    return Path(
        cookiecutter(
            str(REPO / "template"),
            no_input=True,
            config_file=str(REPO / "conf" / "embedded-local.yaml"),
            output_dir=str(where),
        )
    )


PROJECT = rendered_project()
# Its configs name its transform (orders_stream.transform:transform): importable here too, after
# the engine this suite proves (the template's own, first on the path).
sys.path.append(str(PROJECT / "src"))


def project_env(**extra: str) -> dict[str, str]:
    """The environment of a process that runs the project: its src/ first on PYTHONPATH (the
    config's transform is the project's own)."""
    import os

    return {**os.environ, "PYTHONPATH": str(PROJECT / "src"), **extra}


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again, empty, under the same name (a new topic id)."""
    import time

    from confluent_kafka.admin import AdminClient

    from kafka_delta_dev.produce import ensure_topics

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result()
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    ensure_topics(bootstrap, [topic], partitions)


def run_until_crash(cfg: PipelineConfig, folder: Path, point: str, after: int = 0) -> None:
    """Run ``cfg`` as the project's process (``python -m kafka_delta``) until the crash point
    ``point`` (kafka_delta_dev.faults) kills it, after ``after`` passes; asserts it died
    there, by SIGKILL, and not before."""
    import os
    import signal
    import subprocess

    import yaml

    from kafka_delta_dev.pytest_plugin import connector_conf

    # The project's process starts a Spark of its own: the connector jars the engine needs go
    # on it as a run's config would put them (spark.conf), not only on the test session's.
    jars = connector_conf(cfg.engine.source, cfg.engine.sink)
    if jars:
        spark = cfg.spark.model_copy(update={"conf": {**cfg.spark.conf, **jars}})
        cfg = cfg.model_copy(update={"spark": spark})
    config = folder / "conf" / "crash.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")), encoding="utf-8")
    assert load_config(config) == cfg
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_DELTA_")}
    env.update(
        PYTHONPATH=str(PROJECT / "src"),
        PYSPARK_PYTHON=sys.executable,
        KAFKA_DELTA_CRASH_AT=point,
        **({"KAFKA_DELTA_CRASH_AFTER": str(after)} if after else {}),
    )
    crashed = subprocess.run(
        [sys.executable, "-m", "kafka_delta", "--config", str(config)],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,  # the crash point kills this process group only
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]


def spark_jobs(spark, action: Callable[[], T]) -> tuple[T, list[int]]:
    """(what ``action()`` returned, the Spark jobs it ran on this thread). The jobs are counted
    by a job group of their own: the suites share one session, and Spark's status tracker keeps
    every job a group name ever had, so a name another test used would count its jobs too."""
    context = spark.sparkContext
    group = f"count-{uuid.uuid4().hex}"
    context.setJobGroup(group, group)
    try:
        result = action()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setLocalProperty("spark.job.description", None)
    return result, list(context.statusTracker().getJobIdsForGroup(group))


def table_ids(cfg: PipelineConfig) -> Counter[int]:
    table = DeltaTable(cfg.delta.table, storage_options=cfg.delta.storage_options or None)
    return Counter(table.to_pyarrow_table()["id"].to_pylist())


def table_rows(cfg: PipelineConfig) -> int:
    """The table's rows; 0 before the first commit made it."""
    try:
        return sum(table_ids(cfg).values())
    except Exception:  # no table before the first commit
        return 0


def assert_exactly_once(cfg: PipelineConfig, produced: int) -> None:
    """Every id 0..produced-1 is in the table exactly once."""
    ids = table_ids(cfg)
    assert set(ids) == set(range(produced)), set(range(produced)) ^ set(ids)
    assert max(ids.values()) == 1, [i for i, n in ids.items() if n > 1][:10]


def last_batch(cfg: PipelineConfig) -> int:
    return max(
        int(p.name) for p in (Path(cfg.checkpoint) / "commits").iterdir() if p.name.isdigit()
    )


def forget_last_spark_commit(cfg: PipelineConfig) -> None:
    """Leave the state a crash between the Delta commit and Spark's commit leaves behind:
    the last batch is in the table, but Spark has not recorded it, so it re-runs it."""
    last = last_batch(cfg)
    for entry in (str(last), f".{last}.crc"):
        (Path(cfg.checkpoint) / "commits" / entry).unlink(missing_ok=True)


def assert_offsets_agree(cfg: PipelineConfig) -> None:
    """stored offsets == last batch's planned end offsets == group's committed == latest."""
    admin = KafkaAdmin(cfg.kafka.client_config())
    partitions = admin.partitions(cfg.kafka.topics)
    store = DeltaRsOffsetStore(cfg.delta.table, cfg.pipeline_id, cfg.delta.storage_options)
    stored = store.read(lambda: partitions)
    assert stored is not None
    planned = CheckpointLog(None, cfg.checkpoint).end_offsets(last_batch(cfg))
    committed = admin.committed(cfg.kafka.consumer_group, partitions)
    latest = admin.latest(partitions)
    assert stored.offsets == planned == committed == latest
    assert total_lag(latest, committed) == 0
