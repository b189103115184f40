"""The real parts one sequence of moves runs on: the broker and the Spark session every sequence
shares (one process, one session: a move costs seconds), and the sequence's own topics, tables,
checkpoints and config. Runs are the engine's Pipeline, in this process; a continuous run and a
racing one are threads. What the tables hold is read with delta-rs, Kafka with confluent-kafka:
never through the engine's code."""

from __future__ import annotations

import contextlib
import io
import logging
import random
import re
import shutil
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from confluent_kafka.admin import AdminClient, NewPartitions
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError
from kafka_delta.cli import main as cli
from kafka_delta.config import PipelineConfig
from kafka_delta.decoding.failures import reported
from kafka_delta.kafka.admin import KafkaAdmin
from kafka_delta.pipeline import Pipeline
from kafka_delta_dev.orders import TRANSFORM
from kafka_delta_dev.produce import Transaction, ensure_topics, event, produce_values

from opslib.model import Key, Model, Record, Slot

# How a run may end that an operator expects, by the exception that ends it: what to do next.
EXPECTED = (
    "FencingError",
    "TopicRecreatedError",
    "InjectedCrash",
    "CheckpointInUseError",
    "CheckpointMismatchError",
)
PARTITIONS = 2
PER_BATCH = 40
# The dead-letter table, as the model names it (the tables share one: each holds a bad record
# once).
DEAD = "dead letters"
# A world of several tables: every topic into "all"; into "even", the events with an even id
# (record routing, a route on the transform's output).
ROUTES = {"all": None, "even": "id % 2 = 0"}


@dataclass
class Ended:
    """How a run ended: ``None`` (caught up), or the expected outcome's name, or ``stuck``
    with the failure's text."""

    outcome: str | None
    text: str = ""


def ended(exc: BaseException | None) -> Ended:
    if exc is None:
        return Ended(None)
    for name in EXPECTED:
        sentence = reported(exc, name)
        if sentence is not None:
            return Ended(name, sentence)
    return Ended("stuck", f"{type(exc).__name__}: {str(exc)[:2000]}")


class ReadAgainWarnings(logging.Handler):
    """Counts the runs' warnings that they read records again past where a table's rows end
    (kafka_delta.pipeline, after log cleanup: offsets.stored.from_the_rows)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("this run reads again"):
            self.count += 1


@dataclass
class Live:
    """A continuous run in a thread of this process."""

    pipeline: Pipeline
    thread: threading.Thread
    failure: list[BaseException] = field(default_factory=list)


class World:
    def __init__(
        self,
        spark: Any,
        bootstrap: str,
        workdir: Path,
        sink: str,
        name: str,
        log: Any,
        several: bool = False,
        kafka: bool = True,
    ) -> None:
        self.spark, self.bootstrap, self.sink, self.log = spark, bootstrap, sink, log
        # Apache Kafka's broker, not the stand-in Tansu: aborted transactions are filtered.
        self.kafka = kafka
        # Absolute: the paths go into config files in work/conf/, and a config file's relative
        # paths hang off its project root (the folder holding conf/), not the working folder,
        # so a relative --workdir would have the commands look under work/<workdir>/<name>/.
        self.work = (workdir / name).resolve()
        self.work.mkdir(parents=True)
        # The tables' paths by name (and the dead-letter table's); one table: the config's
        # delta.table, with its default dead-letter table beside it.
        self.several = several
        if several:
            self.paths = {t: str(self.work / t) for t in ROUTES}
            self.paths[DEAD] = str(self.work / "dead-letters")
        else:
            self.paths = {"table": str(self.work / "table")}
            self.paths[DEAD] = self.paths["table"] + "_dead_letters"
        self.tables = [t for t in self.paths if t != DEAD]
        self.checkpoint = str(self.work / "checkpoint")
        self.other_checkpoint = str(self.work / "other-checkpoint")
        self.topics = [f"{name}-{t}" for t in ("a", "b", "c")]
        ensure_topics(bootstrap, self.topics, PARTITIONS)
        self.partitions = dict.fromkeys(self.topics, PARTITIONS)
        self.subscribed = self.topics[:2]
        self.generation = dict.fromkeys(self.topics, 0)
        self.pipeline_id = f"ops-{name}"
        self.live: Live | None = None
        # Per table, the Delta version past which a RESTORE keeps the model true: the newest
        # reset, or the table's version when a topic was created again (see moves.restore).
        self.restore_floor = dict.fromkeys(self.tables, -1)
        # Kafka's latest offsets at each catch-up point, for rewinds to them.
        self.catch_ups: list[dict[tuple[str, int], int]] = []
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.watermark_admin = KafkaAdmin(
            {"bootstrap.servers": bootstrap, "isolation.level": "read_uncommitted"}
        )
        self._config_seq = 0
        self.read_again = ReadAgainWarnings()
        logging.getLogger("kafka_delta.pipeline").addHandler(self.read_again)

    def close(self) -> None:
        logging.getLogger("kafka_delta.pipeline").removeHandler(self.read_again)

    # -- configs ---------------------------------------------------------------------------

    def config(
        self,
        checkpoint: str | None = None,
        continuous: bool = False,
        topics: list[str] | None = None,
    ) -> PipelineConfig:
        return PipelineConfig.model_validate(
            {
                "pipeline_id": self.pipeline_id,
                "transform": TRANSFORM,
                "engine": {"source": "embedded", "sink": self.sink},
                "kafka": {
                    "bootstrap_servers": self.bootstrap,
                    "topics": self.subscribed,
                    "consumer_group": self.pipeline_id,
                    "client": {"fetch.wait.max.ms": 100},
                    "max_records_per_trigger": PER_BATCH,
                    "fail_on_data_loss": True,
                },
                **self._tables(),
                "checkpoint": checkpoint or self.checkpoint,
                "trigger": {
                    "mode": "processing_time" if continuous else "available_now",
                    "interval_seconds": 1,
                },
                "commit_back": {"timeout_seconds": 10},
            }
        )

    def _tables(self) -> dict[str, Any]:
        if not self.several:
            return {"delta": {"table": self.paths["table"]}}
        return {
            "tables": {
                name: {
                    "path": self.paths[name],
                    "dead_letters": {"table": self.paths[DEAD]},
                    **({"route": route} if route else {}),
                }
                for name, route in ROUTES.items()
            }
        }

    def reaches(self, key: Key) -> list[str]:
        """The tables a record lands in: a bad one, the dead-letter table; a good one, the
        tables whose routes it passes."""
        if key[0] == "bad":
            return [DEAD]
        if not self.several:
            return ["table"]
        return ["all"] + (["even"] if int(key[1]) % 2 == 0 else [])  # type: ignore[call-overload]

    def config_file(self, config: PipelineConfig | None = None) -> str:
        self._config_seq += 1
        path = self.work / "conf" / f"run-{self._config_seq}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump((config or self.config()).model_dump(mode="json")))
        return str(path)

    def command(self, *argv: str) -> tuple[int, str]:
        """An operator's command (kafka_delta's command line, in this process)."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = cli(list(argv), prog="ops")
            except SystemExit as exc:
                code = int(exc.code or 0)
        return code, out.getvalue()

    # -- Kafka -----------------------------------------------------------------------------

    def latest(self, topics: list[str] | None = None) -> dict[tuple[str, int], int]:
        """Each partition's high watermark (read_uncommitted: where the next record lands),
        through the engine's metadata client, which asks again after a stale answer (a topic
        just created, a leader that moved)."""
        partitions = {t: list(range(self.partitions[t])) for t in topics or self.topics}
        latest = self.watermark_admin.latest(partitions)
        return {(t, p): o for t, parts in latest.items() for p, o in parts.items()}

    def _produce(
        self, topic: str, values: list[bytes], transactional: bool = False
    ) -> list[tuple[int, int]]:
        """``values`` round-robin over the partitions (``transactional``: in one committed
        transaction, whose commit markers then take an offset in each partition after them);
        (partition, offset) of each, in order."""
        before = self.latest([topic])
        parts = [i % self.partitions[topic] for i in range(len(values))]
        produce_values(
            self.bootstrap,
            topic,
            list(zip(parts, values, strict=True)),
            transactional_id=f"{self.pipeline_id}-{uuid.uuid4().hex[:6]}"
            if transactional
            else None,
        )
        counter: Counter[int] = Counter()
        placed = []
        for p in parts:  # one producer, acks=all: a partition's records follow one another
            placed.append((p, before[(topic, p)] + counter[p]))
            counter[p] += 1
        return placed

    def produce_good(
        self,
        model: Model,
        topic: str,
        count: int,
        rng: random.Random,
        transactional: bool = False,
    ) -> list[Record]:
        ids = list(range(model.next_id, model.next_id + count))
        model.next_id += count
        values = [event(i, rng) for i in ids]
        return self._recorded(model, topic, [("id", i) for i in ids], values, transactional)

    def produce_aborted(self, model: Model, topic: str, count: int, rng: random.Random) -> None:
        """Events in one transaction that is aborted: they take offsets but must never land
        (a read_committed reader skips them), so the model gets no record of them, and one
        found in a table counts as doubled (a record never produced)."""
        ids = list(range(model.next_id, model.next_id + count))
        model.next_id += count
        transaction = Transaction(self.bootstrap, f"{self.pipeline_id}-{uuid.uuid4().hex[:6]}")
        transaction.begin()
        for n, i in enumerate(ids):
            transaction.send(topic, n % self.partitions[topic], event(i, rng))
        transaction.abort()

    def produce_bad(self, model: Model, topic: str, count: int) -> list[Record]:
        values = []
        for _ in range(count):
            values.append(f'{{"broken": {model.next_bad}, "id": '.encode())
            model.next_bad += 1
        return self._recorded(model, topic, [("bad", v) for v in values], values)

    def _recorded(
        self,
        model: Model,
        topic: str,
        keys: list[Key],
        values: list[bytes],
        transactional: bool = False,
    ) -> list[Record]:
        """Produce ``values`` and add each record, known by its key, to the model where it
        landed."""
        placed = self._produce(topic, values, transactional)
        records = [
            Record(key, topic, self.generation[topic], p, o, {t: [1, 1] for t in self.reaches(key)})
            for key, (p, o) in zip(keys, placed, strict=True)
        ]
        for r in records:
            model.add(r)
        return records

    def add_partitions(self, topic: str) -> bool:
        """One more partition of ``topic``; False where the broker refuses CreatePartitions
        (Tansu 0.6)."""
        futures = self.admin.create_partitions([NewPartitions(topic, self.partitions[topic] + 1)])
        try:
            for future in futures.values():
                future.result(30)
        except Exception as exc:
            self.log(f"    CreatePartitions refused: {exc}")
            return False
        self.partitions[topic] += 1
        return True

    def recreate(self, topic: str) -> None:
        for future in self.admin.delete_topics([topic]).values():
            future.result(30)
        deadline = time.monotonic() + 30
        while topic in self.admin.list_topics(timeout=10).topics:
            assert time.monotonic() < deadline, f"topic {topic} still listed after its deletion"
            time.sleep(0.2)
        ensure_topics(self.bootstrap, [topic], PARTITIONS)
        self.partitions[topic] = PARTITIONS
        self.generation[topic] += 1

    # -- runs -------------------------------------------------------------------------------

    def run_once(self, config: PipelineConfig | None = None) -> Ended:
        try:
            Pipeline(self.spark, config or self.config()).run()
        except Exception as exc:
            return ended(exc)
        return Ended(None)

    def start_continuous(self) -> None:
        pipeline = Pipeline(self.spark, self.config(continuous=True))
        live = Live(pipeline, threading.Thread(target=lambda: None, daemon=True))

        def run() -> None:
            try:
                pipeline.run()
            except BaseException as exc:
                live.failure.append(exc)

        live.thread = threading.Thread(target=run, daemon=True, name="continuous-run")
        live.thread.start()
        self.live = live

    def stop_continuous(self) -> Ended:
        live, self.live = self.live, None
        if live is None:
            return Ended(None)
        live.pipeline.request_stop()
        live.thread.join(180)
        if live.thread.is_alive():
            return Ended("stuck", "the continuous run did not stop within 180 s")
        return ended(live.failure[0] if live.failure else None)

    # -- what the tables hold (delta-rs, not the engine) ------------------------------------

    def counts(self) -> dict[Slot, int]:
        found: Counter[Slot] = Counter()
        for table in self.tables:
            try:
                ids = DeltaTable(self.paths[table]).to_pyarrow_table(columns=["id"])["id"]
            except TableNotFoundError:
                continue
            found.update((table, ("id", i)) for i in ids.to_pylist())
        try:
            letters = DeltaTable(self.paths[DEAD]).to_pyarrow_table(columns=["value"])
        except TableNotFoundError:
            letters = pa.table({"value": pa.array([], pa.binary())})
        found.update((DEAD, ("bad", v)) for v in letters["value"].to_pylist())
        return dict(found)

    def pipeline_versions(self, table: str) -> list[int]:
        """Delta versions of the pipeline's commits (data or reset) to ``table``, oldest
        first."""
        try:
            history = DeltaTable(self.paths[table]).history()
        except TableNotFoundError:
            return []
        tag = re.compile(rf'"pipeline_id":"{re.escape(self.pipeline_id)}"')
        return sorted(int(c["version"]) for c in history if tag.search(str(c.get("userMetadata"))))

    def table_version(self, table: str) -> int:
        try:
            return DeltaTable(self.paths[table]).version()
        except TableNotFoundError:
            return -1

    def after_reset(self) -> None:
        """A RESTORE to before now would undo the operator's own move: not drawn."""
        for table in self.tables:
            self.restore_floor[table] = max(self.restore_floor[table], self.table_version(table))

    def restore(self, table: str, version: int) -> None:
        path = self.paths[table]
        if self.sink == "delta_spark":
            self.spark.sql(f"RESTORE TABLE delta.`{path}` TO VERSION AS OF {version}")
        else:
            DeltaTable(path).restore(version)

    def clean_up_the_log(self) -> None:
        """What Delta's log cleanup leaves after the retention period, in every table: other
        writers committed, a Delta checkpoint was written, and every JSON commit it covers is
        deleted."""
        for table in self.tables:
            path = self.paths[table]
            try:
                delta = DeltaTable(path)
            except TableNotFoundError:
                continue
            schema = pa.schema(delta.schema().to_arrow())
            for _ in range(2):
                write_deltalake(path, schema.empty_table(), mode="append")
            delta = DeltaTable(path)
            delta.create_checkpoint()
            covered = delta.version()
            log = Path(path) / "_delta_log"
            for commit in log.glob("*.json"):
                if int(commit.stem) < covered:
                    commit.unlink()
                    (log / f".{commit.name}.crc").unlink(missing_ok=True)
                    (log / f"{commit.stem}.crc").unlink(missing_ok=True)

    def delete_table(self, table: str) -> None:
        shutil.rmtree(self.paths[table])
        self.restore_floor[table] = -1

    def checkpoint_has_progress(self) -> bool:
        """Spark recorded a finished batch in the checkpoint (its ``commits/`` folder)."""
        commits = Path(self.checkpoint) / "commits"
        return commits.is_dir() and any(p.name.isdigit() for p in commits.iterdir())

    def delete_checkpoint(self) -> None:
        shutil.rmtree(self.checkpoint, ignore_errors=True)
