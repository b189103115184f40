"""The cluster engine's pieces that need no connector jars, on a real SparkSession: config to
Spark kafka source options, writer options, the MERGE session confs, history paging, and a clear
stop when the jars are missing. Its end-to-end proofs are in test_engine_contract.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kafka_delta.cli import main
from kafka_delta.config import KafkaConfig, PipelineConfig
from kafka_delta.dead_letters import split_dead_letters_df
from kafka_delta.delta.spark_commit import (
    TXN_APP_ID_CONF,
    TXN_VERSION_CONF,
    USER_METADATA_CONF,
    append_options,
    delta_txn_confs,
    lost_race,
)
from kafka_delta.delta.spark_offset_store import DeltaSparkLog
from kafka_delta.engine_factory import build_engine
from kafka_delta.offsets.model import BatchCommit, StoredOffsets, parse_user_metadata
from kafka_delta.offsets.stored import newest_stored_paged
from kafka_delta.recovery.checkpoint import CheckpointLog
from kafka_delta.runtime.connectors import ConnectorMissingError, missing_connectors
from kafka_delta.sources.spark_kafka import SparkKafkaSource, spark_kafka_options
from support import PROJECT, spark_jobs

COMMIT = BatchCommit("orders", "orders.q-1", 7, {"orders": {0: 120, 1: 80}}, seq=12)


def _kafka(**overrides: object) -> KafkaConfig:
    return KafkaConfig.model_validate(
        {
            "bootstrap_servers": "b1:9092,b2:9092",
            "topics": ["orders", "payments"],
            "consumer_group": "g",
            **overrides,
        }
    )


class _Admin:
    """Stands in for the metadata query: partitions per topic."""

    def partitions(self, topics):
        return {"orders": [0, 1, 2], "payments": [0]}


def test_config_maps_to_sparks_kafka_source_options() -> None:
    kafka = _kafka(
        max_records_per_trigger=1000,
        fail_on_data_loss=False,
        jvm_client={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"},
        # librdkafka only: not for the Java client
        client={"fetch.wait.max.ms": 100, "security.protocol": "SASL_SSL"},
    )

    options = spark_kafka_options(kafka, "earliest", 4)

    assert options == {
        "kafka.isolation.level": "read_committed",
        "kafka.bootstrap.servers": "b1:9092,b2:9092",
        "subscribe": "orders,payments",
        "startingOffsets": "earliest",
        "failOnDataLoss": "false",
        "includeHeaders": "true",
        # No partition split across tasks with failOnDataLoss off (see spark_kafka_options).
        "maxOffsetsPerTrigger": "1000",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.request.timeout.ms": "10000",
        "kafka.default.api.timeout.ms": "10000",
        "kafkaConsumer.pollTimeoutMs": "120000",
    }
    strict = spark_kafka_options(_kafka(max_records_per_trigger=None), "latest", 3)
    assert strict["failOnDataLoss"] == "true" and strict["minPartitions"] == "3"
    assert "maxOffsetsPerTrigger" not in spark_kafka_options(
        _kafka(max_records_per_trigger=None), "latest", 1
    )


def test_the_java_clients_timeouts_notice_an_outage_in_seconds_and_config_can_lift_them() -> None:
    """Kafka's 30 s request and 60 s call timeouts, tried 3 times by Spark's offset lookups,
    let a run notice an outage only after 3 minutes (test_kafka_outage.py proves the run with
    the short ones against a paused broker). Spark's retries stay (fewer would turn a latest
    offset that went backwards into a data-loss verdict); the read task polls as long as
    kafka.poll_timeout_seconds, as the embedded source's does; the client refuses a call
    timeout below the request timeout, so one lifted in jvm_client lifts the other."""
    options = spark_kafka_options(_kafka(poll_timeout_seconds=30), "earliest", 1)
    assert options["kafka.request.timeout.ms"] == "10000"
    assert options["kafka.default.api.timeout.ms"] == "10000"
    assert options["kafkaConsumer.pollTimeoutMs"] == "30000"
    assert not [k for k in options if k.startswith("fetchOffset.")]

    lifted = spark_kafka_options(_kafka(jvm_client={"request.timeout.ms": 40000}), "earliest", 1)
    assert lifted["kafka.request.timeout.ms"] == "40000"
    assert lifted["kafka.default.api.timeout.ms"] == "40000"
    own = _kafka(jvm_client={"default.api.timeout.ms": "90000"})
    assert spark_kafka_options(own, "earliest", 1)["kafka.default.api.timeout.ms"] == "90000"


def test_sparks_kafka_source_reads_only_committed_transactions_unless_overridden() -> None:
    # The Java client defaults to read_uncommitted: aborted records would land in the table.
    assert spark_kafka_options(_kafka(), "earliest", 1)["kafka.isolation.level"] == (
        "read_committed"
    )
    overridden = _kafka(jvm_client={"isolation.level": "read_uncommitted"})
    assert spark_kafka_options(overridden, "earliest", 1)["kafka.isolation.level"] == (
        "read_uncommitted"
    )


def test_java_client_credentials_without_librdkafka_ones_are_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match=r"give kafka\.client the same security settings"):
        _kafka(jvm_client={"security.protocol": "SASL_SSL", "sasl.jaas.config": "x"})
    both = _kafka(
        jvm_client={"security.protocol": "SASL_SSL"}, client={"security.protocol": "sasl_ssl"}
    )
    assert both.client["security.protocol"] == "sasl_ssl"


def test_a_restarted_checkpoint_asks_kafka_nothing_for_its_starting_offsets() -> None:
    class _NoKafka:
        def partitions(self, topics):
            raise AssertionError("no metadata query when the checkpoint already has a plan")

    stored = StoredOffsets({"orders": {0: 50}}, 4, "orders.q", 2)
    source = SparkKafkaSource(_kafka(), admin=_NoKafka())
    assert source.starting(stored, resuming=True) == "earliest"


def test_a_new_checkpoint_starts_at_the_stored_offsets_of_every_subscribed_partition() -> None:
    stored = StoredOffsets({"orders": {0: 50, 1: 7}, "gone": {0: 3}}, 4, "orders.q", 2)

    source = SparkKafkaSource(_kafka(), admin=_Admin())
    starting = source.starting(stored)
    options = spark_kafka_options(_kafka(), starting, 2)

    # Spark wants every partition: -2 (earliest) where nothing is stored; no unsubscribed topic.
    assert json.loads(options["startingOffsets"]) == {
        "orders": {"0": 50, "1": 7, "2": -2},
        "payments": {"0": -2},
    }
    # starting_offsets: latest only applies to the pipeline's very first start: a partition
    # added since (here all of payments, and orders[2]) starts at its earliest offset, or the
    # records produced to it before this checkpoint were skipped.
    latest_default = SparkKafkaSource(_kafka(starting_offsets="latest"), admin=_Admin())
    assert latest_default.starting(stored)["payments"] == {"0": -2}
    assert latest_default.starting(stored)["orders"]["2"] == -2
    assert latest_default.starting(None) == "latest"
    assert source.starting(None) == "earliest"


def test_configured_starting_offsets_of_its_own_reach_spark_with_every_partition() -> None:
    kafka = _kafka(starting_offsets={"orders": {0: 5, 1: -1}})
    source = SparkKafkaSource(kafka, admin=_Admin())

    # The pipeline's first start: the map's offsets, -2 for a partition it leaves out (Spark
    # refuses a map without every partition of the subscription).
    options = spark_kafka_options(kafka, source.starting(None), 2)
    assert json.loads(options["startingOffsets"]) == {
        "orders": {"0": 5, "1": -1, "2": -2},
        "payments": {"0": -2},
    }
    # Once the table stores offsets, they win, and a partition without one starts at earliest.
    stored = StoredOffsets({"orders": {0: 50}}, 4, "orders.q", 2)
    assert source.starting(stored) == {"orders": {"0": 50, "1": -2, "2": -2}, "payments": {"0": -2}}


def test_append_carries_txn_and_offsets_as_writer_options() -> None:
    options = append_options(COMMIT)

    # The pipeline-wide fence txn: every run of the pipeline writes it (atomic fencing, I6).
    assert options["txnAppId"] == "orders:fence"
    assert options["txnVersion"] == "12"
    assert parse_user_metadata(options["userMetadata"], "orders") == COMMIT


def test_merge_session_confs_are_set_inside_the_batch_and_cleared_after_it(spark) -> None:
    spark.conf.set(USER_METADATA_CONF, "someone else's")
    seen = {}

    with delta_txn_confs(spark, COMMIT):
        seen = {k: spark.conf.get(k, None) for k in (TXN_APP_ID_CONF, TXN_VERSION_CONF)}
        inside_metadata = spark.conf.get(USER_METADATA_CONF)

    assert seen == {TXN_APP_ID_CONF: "orders:fence", TXN_VERSION_CONF: "12"}
    assert parse_user_metadata(inside_metadata, "orders") == COMMIT
    assert spark.conf.get(TXN_APP_ID_CONF, None) is None
    assert spark.conf.get(TXN_VERSION_CONF, None) is None
    assert spark.conf.get(USER_METADATA_CONF) == "someone else's"
    spark.conf.unset(USER_METADATA_CONF)


def test_merge_session_confs_are_cleared_even_when_the_merge_fails(spark) -> None:
    with pytest.raises(RuntimeError, match="merge failed"), delta_txn_confs(spark, COMMIT):
        raise RuntimeError("merge failed")

    for key in (TXN_APP_ID_CONF, TXN_VERSION_CONF, USER_METADATA_CONF):
        assert spark.conf.get(key, None) is None, key


def test_a_batch_for_delta_spark_is_split_in_spark_and_cached_once(spark) -> None:
    out = spark.createDataFrame(
        [(1, "o", 0, 10, None), (2, "o", 0, 11, "malformed JSON"), (3, "o", 1, 4, None)],
        "id long, topic string, partition int, offset long, _error string",
    )

    batch = split_dead_letters_df(out)

    assert sorted(r.id for r in batch.rows.collect()) == [1, 3]
    assert "_error" not in batch.rows.columns
    assert batch.dead is not None
    assert batch.dead.to_pylist() == [
        {"topic": "o", "partition": 0, "offset": 11, "_error": "malformed JSON"}
    ]
    clean = split_dead_letters_df(out.filter("_error IS NULL").drop("_error"))
    assert clean.dead is None and clean.rows.count() == 2
    # Either way the count and the write read the cached batch, not Kafka a second time.
    for split in (batch, clean):
        assert "InMemoryRelation" in split.rows._jdf.queryExecution().optimizedPlan().toString()
        split.release()


class _History:
    """A SparkTable stand-in whose history(limit) is the rows DESCRIBE HISTORY would give,
    newest first."""

    def __init__(self, spark, rows: list[tuple[int, str | None]]) -> None:
        self.spark, self.rows, self.limits = spark, rows, []

    def history(self, limit: int | None = None) -> list[dict[str, object]]:
        self.limits.append(limit)
        rows = self.rows if limit is None else self.rows[:limit]
        return [
            {
                "version": v,
                "timestamp": None,
                "operation": "WRITE",
                "operationParameters": {},
                "userMetadata": m,
            }
            for v, m in rows
        ]


def test_history_is_read_in_growing_pages_past_other_writers(spark) -> None:
    ours = BatchCommit("orders", "orders.q", 3, {"orders": {0: 9}}).user_metadata()
    other = BatchCommit("refunds", "refunds.q", 8, {"r": {0: 1}}).user_metadata()
    rows = [(100 - i, other if i % 2 else None) for i in range(30)] + [(70, ours)]
    table = _History(spark, rows)

    stored = newest_stored_paged(_log(spark, table).history, "orders")

    assert stored == StoredOffsets({"orders": {0: 9}}, 70, "orders.q", 3)
    assert table.limits == [3, 20, 500]
    few = _log(spark, _History(spark, rows[:5]))
    assert newest_stored_paged(few.history, "orders") is None


def _log(spark, history: _History) -> DeltaSparkLog:
    """The delta-spark log reader over a stand-in of the table."""
    return DeltaSparkLog(history, "orders", None)  # type: ignore[arg-type]


def test_the_fence_seq_without_a_txn_reader_never_falls_below_the_stored_fence(spark) -> None:
    """Spark reads no txn action: where the history cannot show the fence (a RESTORE undid the
    pipeline's newest commits; log cleanup removed them), the delta-spark reader answers with a
    seq no lower than any the table can store (kafka_delta.delta.spark_offset_store)."""
    from kafka_delta.offsets.model import fence_app_id

    def commit(seq: int) -> str:
        return BatchCommit("orders", "orders.q", seq, {"orders": {0: seq}}, seq=seq).user_metadata()

    # The whole log is there (it starts at version 0): the highest seq the pipeline wrote.
    whole = _log(spark, _History(spark, [(4, commit(3)), (3, None), (2, commit(7)), (0, None)]))
    assert whole.transaction_version(fence_app_id("orders")) == 7
    # No commit of the pipeline in the whole log: it never committed, there is no fence.
    assert (
        _log(spark, _History(spark, [(1, None), (0, None)])).transaction_version(
            fence_app_id("orders")
        )
        is None
    )
    # Log cleanup shortened it (it starts at 40): the bound, newest version + 1.
    cleaned = _log(spark, _History(spark, [(52, None), (41, commit(3)), (40, None)]))
    assert cleaned.transaction_version(fence_app_id("orders")) == 53
    # The delta-rs sink's offset and topic-id txns: no hint on this side.
    assert cleaned.transaction_version("orders:offset:orders:0") is None


def test_checkpoint_is_read_through_spark_when_it_is_not_a_local_path(
    spark, tmp_path: Path
) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text('v1\n{"batchWatermarkMs":0}\n{"o":{"0":12,"1":5}}\n')
    (tmp_path / "metadata").write_text('{"id":"0b5c-query"}\n')
    log = CheckpointLog(spark, str(tmp_path))
    log._local = None  # as for s3:// or abfss://: every read goes through spark.read

    assert log.end_offsets(4) == {"o": {0: 12, 1: 5}}
    assert log.query_id() == "0b5c-query"
    assert not log.has_progress()
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "4").write_text("v1\n{}\n")
    assert log.has_progress()


def _missing_cluster_connectors(spark) -> list[str]:
    """The cluster engine's connectors this session lacks: both on a bare machine, only
    spark-sql-kafka where delta-spark's jars are on the classpath (KAFKA_DELTA_JARS)."""
    missing = missing_connectors(spark, ["delta-spark", "spark-sql-kafka"])
    if not missing:
        pytest.skip("the connector jars are on the classpath: the engine can run")
    return missing


def test_cluster_engine_without_its_jars_stops_before_any_work(spark, tmp_path: Path) -> None:
    missing = _missing_cluster_connectors(spark)
    cfg = PipelineConfig.model_validate(
        {
            "pipeline_id": "p",
            "engine": "cluster",
            "kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["o"], "consumer_group": "g"},
            "delta": {"table": str(tmp_path / "t")},
            "checkpoint": str(tmp_path / "c"),
        }
    )

    with pytest.raises(ConnectorMissingError, match=r"run_cluster_local\.sh") as raised:
        build_engine(spark, cfg)
    assert f"needs the {' and '.join(missing)} jars" in str(raised.value)
    assert not (tmp_path / "t").exists()


def test_main_on_the_cluster_engine_without_its_jars_exits_2_saying_how_to_get_them(
    spark, kafka_bootstrap, new_topics, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = _missing_cluster_connectors(spark)
    data = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text())
    # a reachable broker and existing topics: main checks them before Spark starts
    data["kafka"]["bootstrap_servers"] = kafka_bootstrap
    data["kafka"]["topics"] = new_topics(1)
    data["delta"]["table"] = str(tmp_path / "table")
    data["checkpoint"] = str(tmp_path / "checkpoint")
    data["decoding"]["value"]["schema_file"] = str(PROJECT / "schemas" / "order_event.ddl")
    (tmp_path / "conf").mkdir()
    config = tmp_path / "conf" / "local.yaml"
    config.write_text(yaml.safe_dump(data))

    code = main(["--config", str(config), "--engine", "cluster"])

    assert code == 2
    err = capsys.readouterr().err
    assert f"needs the {' and '.join(missing)} jars" in err, err
    assert "run_cluster_local.sh" in err
    assert not (tmp_path / "table").exists() and not (tmp_path / "checkpoint").exists()


def test_connector_packages_ask_for_the_delta_artifact_built_for_the_installed_spark() -> None:
    from importlib.metadata import version

    from pyspark.sql import SparkSession

    from kafka_delta.runtime.connectors import connector_packages

    delta, spark = version("delta-spark"), version("pyspark")
    spark_major_minor = ".".join(spark.split(".")[:2])

    packages = connector_packages()

    assert packages == [
        f"io.delta:delta-spark_{spark_major_minor}_2.13:{delta}",
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark}",
    ]
    if (spark_major_minor, delta) == ("4.2", "4.4.0"):  # the pinned pair
        assert packages[0] == "io.delta:delta-spark_4.2_2.13:4.4.0"
    # the same coordinate delta-spark's own helper asks for (it only sets it on a builder;
    # nothing is fetched until a session starts)
    delta_pip = pytest.importorskip("delta.pip_utils")
    builder = delta_pip.configure_spark_with_delta_pip(SparkSession.Builder())
    assert builder._options["spark.jars.packages"] == packages[0]


def _delta_spark_sink(spark, tmp_path: Path, mode=None):
    from conftest import skip_without_connectors

    skip_without_connectors(spark, {"source": "embedded", "sink": "delta_spark"})
    from kafka_delta.sinks.delta_spark.sink import DeltaSparkSink

    uri = str(tmp_path / "table")
    checkpoint = str(tmp_path / "checkpoint")
    return uri, lambda: DeltaSparkSink(spark, uri, "p", mode, checkpoint=checkpoint)


def _ids(spark, *ids: int):
    return spark.createDataFrame([(i,) for i in ids], "id long")


def test_a_delta_spark_append_reads_no_history_after_its_own_commit_and_costs_the_plain_writes_jobs(
    spark, tmp_path: Path
) -> None:
    # Reading delta-spark's history is a Spark job of its own (DeltaHistoryManager reads the
    # commit files in one, through DESCRIBE HISTORY as through DeltaTable.history()). Where the
    # sink's own last commit is still the table's newest version (Delta says so when asked to
    # time-travel one version past it: an analysis, no job), the check reads none of it; a
    # sink that made no commit yet (a new run) reads ONE page and nothing else (whether the
    # table exists is the page itself). The commit costs the write's jobs, the same as the
    # plain append Databricks documents for foreachBatch: the session that ran it says it
    # committed and where, and the rows come from an observation in the write's own job
    # (CommitWatch), never a count nor the log read back.
    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    plain = str(tmp_path / "plain")
    sink = new_sink()
    first = BatchCommit("p", "p.q", 0, {"o": {0: 1}})
    sink.commit_batch(_ids(spark, 1), first, {})
    _ids(spark, 1).write.format("delta").option("txnAppId", "x").option("txnVersion", "0").save(
        plain
    )
    frame = _ids(spark, 2, 3).persist()
    frame.count()
    second = BatchCommit("p", "p.q", 1, {"o": {0: 3}})

    replay, check_jobs = spark_jobs(spark, lambda: sink.check(second, {"o": {0: 1}}))
    fresh, fresh_jobs = spark_jobs(spark, lambda: new_sink().check(second, {"o": {0: 1}}))
    result, sink_jobs = spark_jobs(spark, lambda: sink.commit_batch(frame, second, {"o": {0: 1}}))
    _, plain_jobs = spark_jobs(
        spark,
        lambda: (
            frame.write.format("delta")
            .mode("append")
            .option("txnAppId", "x")
            .option("txnVersion", "1")
            .save(plain)
        ),
    )

    assert not replay and check_jobs == [], check_jobs
    assert not fresh and len(fresh_jobs) == 1, fresh_jobs
    assert result.written and result.rows == 2 and result.delta_version == 1
    assert result.read_back_s == 0.0
    assert plain_jobs and len(sink_jobs) == len(plain_jobs), (sink_jobs, plain_jobs)
    assert sorted(r.id for r in spark.read.format("delta").load(uri).collect()) == [1, 2, 3]
    # A replay is recognised as well, by a new run's one reading and without it.
    replay, replay_jobs = spark_jobs(spark, lambda: sink.check(second, {"o": {0: 1}}))
    assert replay and replay_jobs == [], replay_jobs
    replay, replay_jobs = spark_jobs(spark, lambda: new_sink().check(second, {"o": {0: 1}}))
    assert replay and len(replay_jobs) == 1, replay_jobs


def test_a_steady_delta_spark_batch_reads_one_page_a_step_and_analyses_the_table_once_however_old(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a steady batch reads of the table may not grow with its versions: past the first
    # pages of history (3, 20) and two Delta checkpoints (every 10 commits), a new run's check
    # still reads ONE small page (3 commits: a history read is a Spark job whose tasks open
    # every commit file of the page), and a check after the sink's own commit none; the commit
    # none (its session says where it landed), and materializing analyses the table once.
    # Every analysis and every history read brings the snapshot up to date, a listing of the
    # log folder, which on a local or Hadoop file system costs more the longer the log: their
    # number per batch is what the sink controls.
    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    sink = new_sink()
    end = 0
    for batch in range(21):
        commit = BatchCommit("p", "p.q", batch, {"o": {0: end + 1}})
        sink.commit_batch(_ids(spark, end), commit, {"o": {0: end}} if batch else {})
        end += 1
    sink = new_sink()  # a new run's: no commit of its own yet
    pages: list[int | None] = []
    analyses: list[str] = []
    real_history, real_frame = sink.table.history, sink.table.frame

    def history(limit: int | None) -> list[dict[str, object]]:
        pages.append(limit)
        return real_history(limit)

    def frame():
        analyses.append("frame")
        return real_frame()

    monkeypatch.setattr(sink.table, "history", history)
    monkeypatch.setattr(sink.table, "frame", frame)
    steady = BatchCommit("p", "p.q", 21, {"o": {0: end + 2}})

    assert not sink.check(steady, {"o": {0: end}})
    written = sink.materialize(_ids(spark, end, end + 1))
    assert analyses == ["frame"], analyses
    result = sink.commit_batch(written.rows, steady, {"o": {0: end}})
    written.release()

    assert result.written and result.rows == 2 and result.delta_version == 21
    assert pages == [3], pages
    assert result.read_back_s == 0.0
    assert len(list((Path(uri) / "_delta_log").glob("*.checkpoint.parquet"))) == 2
    # The next batch: the sink's own commit is the newest version, no history is read.
    assert not sink.check(BatchCommit("p", "p.q", 22, {"o": {0: end + 3}}), {"o": {0: end + 2}})
    assert pages == [3], pages


# What may happen to a table between two batches of a run, and the next batch's check after it.
BETWEEN_BATCHES = ["nothing", "foreign_append", "restore", "other_run", "recreated", "deleted"]


@pytest.mark.parametrize("move", BETWEEN_BATCHES)
def test_a_check_after_the_sinks_own_commit_decides_as_a_new_runs_reading_whatever_came_between(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, move: str
) -> None:
    """The check that reads no history (the sink's own last commit still the table's newest
    version) decides what a sink reading the history decides, after whatever an operator or
    another writer did between two batches: the same replay answer or the same refusal, and
    the same stored offsets. Without Delta's word on the newest version, the RESTORE, the other
    run and the recreated table each let the next batch commit on top of offsets the table no
    longer ends at (a batch lost, or read twice)."""
    from kafka_delta.sinks.delta_spark.sink import DeltaSparkSink

    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    sink = new_sink()
    for batch in range(2):
        commit = BatchCommit("p", "p.q", batch, {"o": {0: 2 * batch + 2}})
        start = {"o": {0: 2 * batch}} if batch else {}
        sink.commit_batch(_ids(spark, 2 * batch, 2 * batch + 1), commit, start)
    assert sink._head is not None and sink._head[0] == 1
    if move == "foreign_append":
        _ids(spark, 100).write.format("delta").mode("append").save(uri)
    elif move == "restore":
        spark.sql(f"RESTORE TABLE delta.`{uri}` TO VERSION AS OF 0")
    elif move == "other_run":
        other = DeltaSparkSink(spark, uri, "p", checkpoint=str(tmp_path / "other"))
        other.commit_batch(_ids(spark, 4, 5, 6), BatchCommit("p", "p.r", 0, {"o": {0: 7}}), None)
    elif move in ("recreated", "deleted"):
        import shutil

        shutil.rmtree(uri)
        if move == "recreated":  # fewer versions than before: version 1 is gone
            _ids(spark, 100).write.format("delta").save(uri)
    following = BatchCommit("p", "p.q", 2, {"o": {0: 6}})

    def decision(checker: DeltaSparkSink) -> tuple[object, object]:
        try:
            return checker.check(following, {"o": {0: 4}}), checker._checked
        except Exception as exc:
            return type(exc).__name__, str(exc)

    pages: list[int | None] = []
    real_history = sink.table.history
    monkeypatch.setattr(sink.table, "history", lambda n: pages.append(n) or real_history(n))
    probed = decision(sink)
    read = decision(new_sink())
    assert probed == read, (probed, read)
    if move == "nothing":  # the steady batch: decided without the history
        assert pages == [] and probed[0] is False, (pages, probed)
    else:  # the history, read as a new run reads it
        assert pages[:1] == [3], pages
    if move in ("restore", "other_run"):  # the table no longer ends where the run does
        assert probed[0] == "FencingError", probed


def _events(spark, ids, bad: tuple[int, ...] = ()):
    """Decoded rows as the transform hands them over: positions, and ``_error`` set for the
    ids in ``bad`` (dead letters)."""
    return spark.createDataFrame(
        [(i, "o", 0, i, "malformed JSON" if i in bad else None) for i in ids],
        "id long, topic string, partition int, offset long, _error string",
    )


def test_a_clean_delta_spark_batch_is_read_and_written_by_the_writes_own_job(
    spark, tmp_path: Path
) -> None:
    # A clean append is not cached nor scanned for dead letters by a job of its own: the
    # write's job reads, transforms and writes it (a dead letter would fail that job before
    # the commit). So the commit costs what the plain foreachBatch write of the same rows
    # costs, and materializing costs no job.
    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    plain = str(tmp_path / "plain")
    sink = new_sink()
    first = _events(spark, [0]).drop("_error")
    sink.commit_batch(first, BatchCommit("p", "p.q", 0, {"o": {0: 1}}), {})
    first.write.format("delta").option("txnAppId", "x").option("txnVersion", "0").save(plain)
    second = BatchCommit("p", "p.q", 1, {"o": {0: 4}})
    assert not sink.check(second, {"o": {0: 1}})

    written, materialize_jobs = spark_jobs(
        spark, lambda: sink.materialize(_events(spark, [1, 2, 3]))
    )
    result, sink_jobs = spark_jobs(
        spark, lambda: sink.commit_batch(written.rows, second, {"o": {0: 1}})
    )
    written.release()
    _, plain_jobs = spark_jobs(
        spark,
        lambda: (
            _events(spark, [1, 2, 3])
            .drop("_error")
            .write.format("delta")
            .mode("append")
            .option("txnAppId", "x")
            .option("txnVersion", "1")
            .save(plain)
        ),
    )

    assert written.dead is None and materialize_jobs == [], materialize_jobs
    assert plain_jobs and len(sink_jobs) == len(plain_jobs), (sink_jobs, plain_jobs)
    assert result.written and result.rows == 3 and result.delta_version == 1
    table = spark.read.format("delta").load(uri)
    assert "_error" not in table.columns
    assert sorted(r.id for r in table.collect()) == [0, 1, 2, 3]


def test_a_batch_written_as_clean_that_holds_a_dead_letter_commits_nothing_and_is_split(
    spark, tmp_path: Path
) -> None:
    from kafka_delta.engine import DeadLettersFound
    from kafka_delta.sinks.delta_spark.sink import SPLIT_AFTER_DEAD_LETTERS

    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    sink = new_sink()
    first = _events(spark, [0]).drop("_error")
    sink.commit_batch(first, BatchCommit("p", "p.q", 0, {"o": {0: 1}}), {})
    second = BatchCommit("p", "p.q", 1, {"o": {0: 4}})
    assert not sink.check(second, {"o": {0: 1}})
    clean = sink.materialize(_events(spark, [1, 2, 3], bad=(2,)))
    assert clean.dead is None  # handed back to be written as clean

    with pytest.raises(DeadLettersFound, match="batch 1 holds dead letters"):
        sink.commit_batch(clean.rows, second, {"o": {0: 1}})

    # Nothing of the batch was committed: its rows, its offsets and its fence wait for its
    # dead letters, as when every batch was split first.
    assert [r.version for r in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()] == [0]
    assert not sink.check(second, {"o": {0: 1}})
    split = sink.materialize(_events(spark, [1, 2, 3], bad=(2,)), split=True)
    assert split.dead is not None and split.dead.column("offset").to_pylist() == [2]
    result = sink.commit_batch(split.rows, second, {"o": {0: 1}})
    split.release()
    assert result.written and result.rows == 2 and result.delta_version == 1
    assert sorted(r.id for r in spark.read.format("delta").load(uri).collect()) == [0, 1, 3]
    # The next batches are split before their write, not tried as clean first...
    for n in range(SPLIT_AFTER_DEAD_LETTERS):
        later = sink.materialize(_events(spark, [10 + n]))
        assert later.dead is None and "InMemoryRelation" in _plan(later.rows), n
        later.release()
    # ... until as many clean ones have passed.
    assert "InMemoryRelation" not in _plan(sink.materialize(_events(spark, [99])).rows)


@pytest.mark.broker
def test_a_dead_letter_after_clean_batches_lands_once_and_every_batch_counts_what_it_read(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path: Path
) -> None:
    # Batch 0 is written as clean in one job; batch 1 holds a record the decoder rejects, so
    # its clean write fails before its commit and the batch is checked, split, its dead letter
    # sent and committed; batch 2 is split from the start. Every record lands exactly once,
    # the dead letter once, and each batch's progress counts the records it read (the failed
    # job's partial count is not taken). Inside foreachBatch the batch's session tells each
    # commit's version and the rows come from the write's own job: no batch reads its table's
    # log back (CommitWatch; a read-back is a Spark job, timed apart as the step read_back).
    import json as _json

    from deltalake import DeltaTable

    from kafka_delta.pipeline import Pipeline
    from kafka_delta_dev.produce import produce_values

    engine = {"source": "embedded", "sink": "delta_spark"}
    from conftest import skip_without_connectors

    skip_without_connectors(spark, engine)
    (topic,) = new_topics(1, partitions=1)
    event = {"event_type": "paid", "amount": 1.5, "event_time": "2026-01-01T00:00:00Z"}
    values = [_json.dumps({**event, "id": i}).encode() for i in range(8)]
    values.insert(4, b"{not json")
    produce_values(kafka_bootstrap, topic, [(0, v) for v in values])
    schema = str(PROJECT / "schemas" / "order_event.ddl")
    cfg = make_config([topic], engine=engine, max_records_per_trigger=3).with_overrides(
        decoding={"value": {"format": "json", "schema_file": schema}}
    )
    progress: list[object] = []

    class Listener:
        def on_batch(self, batch: object) -> None:
            progress.append(batch)

        def on_run_end(self, commit_back: object) -> None:
            pass

    Pipeline(spark, cfg, listeners=[Listener()]).run()

    ids = sorted(r.id for r in spark.read.format("delta").load(cfg.delta.table).collect())
    assert ids == list(range(8))
    assert [(b.records_read, b.rows_written, b.dead_letters) for b in progress] == [
        (3, 3, 0),
        (3, 2, 1),
        (3, 3, 0),
    ]
    assert [b.delta_version for b in progress] == [0, 1, 2]
    assert [(b.steps or {}).get("read_back") for b in progress] == [0.0, 0.0, 0.0], progress
    assert cfg.dead_letter_table is not None
    letters = DeltaTable(cfg.dead_letter_table).to_pyarrow_table().to_pylist()
    assert [(r["offset"], r["value"]) for r in letters] == [(4, b"{not json")]


def _plan(frame) -> str:
    return frame._jdf.queryExecution().optimizedPlan().toString()


def test_timestamps_far_from_now_the_delta_spark_sink_writes_read_back_in_deltalake(
    spark, tmp_path: Path
) -> None:
    # Spark's default INT96 reads in Arrow as nanoseconds, which cannot hold 1500 or 3000: the
    # engine's sessions write INT64 microseconds (runtime/spark_session.py).
    import datetime as dt

    from deltalake import DeltaTable

    from kafka_delta.runtime.spark_session import READABLE_PARQUET, use_readable_parquet

    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    before = {k: spark.conf.get(k, None) for k in READABLE_PARQUET}
    use_readable_parquet(spark)
    try:
        times = [dt.datetime(1500, 3, 1, 12, tzinfo=dt.UTC), dt.datetime(3000, 1, 1, tzinfo=dt.UTC)]
        frame = spark.createDataFrame(
            [(i, t) for i, t in enumerate(times)], "id long, at timestamp"
        )
        new_sink().commit_batch(frame, BatchCommit("p", "p.q", 0, {"o": {0: 2}}), {})
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)

    read = DeltaTable(uri).to_pyarrow_table().sort_by("id")
    assert read.column("at").to_pylist() == times


@pytest.mark.parametrize("type_widening", [False, True])
def test_the_delta_spark_sink_widens_a_promoted_column_before_the_batch(
    spark, tmp_path: Path, type_widening: bool
) -> None:
    """int -> long, float -> double and int -> double (Avro's promotions): with Delta's type
    widening on, ALTER COLUMN ... TYPE in place; without it, the table rewritten in one commit
    (which deltalake still reads). Every value lands, none a dead letter; a replay widens
    nothing again."""
    from deltalake import DeltaTable

    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    sink = new_sink()
    narrow = spark.createDataFrame([(1, 1, 0.5, 1)], "id long, n int, f float, d int")
    sink.commit_batch(narrow, BatchCommit("p", "p.q", 0, {"o": {0: 1}}), {})
    if type_widening:
        spark.sql(
            f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')"
        )
    wide = spark.createDataFrame([(2, 2**40, 0.1, 2.5)], "id long, n long, f double, d double")
    second = BatchCommit("p", "p.q", 1, {"o": {0: 2}})
    assert not sink.check(second, {"o": {0: 1}})
    batch = sink.materialize(wide)
    assert batch.dead is None or batch.dead.num_rows == 0
    result = sink.commit_batch(batch.rows, second, {"o": {0: 1}})
    batch.release()

    assert result.written
    read = spark.read.format("delta").load(uri)
    assert [read.schema[c].dataType.simpleString() for c in ("n", "f", "d")] == [
        "bigint",
        "double",
        "double",
    ]
    rows = {r["id"]: r for r in read.collect()}
    assert (rows[1]["n"], rows[1]["d"]) == (1, 1.0)
    assert (rows[2]["n"], rows[2]["f"], rows[2]["d"]) == (2**40, 0.1, 2.5)
    history = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
    modes = [(r["operation"], (r["operationParameters"] or {}).get("mode")) for r in history]
    rewrites = sum(mode == "Overwrite" for _, mode in modes)
    if type_widening:
        assert rewrites == 0 and any(op == "CHANGE COLUMN" for op, _ in modes), modes
    else:
        assert rewrites == 1, modes
        assert sorted(DeltaTable(uri).to_pyarrow_table()["n"].to_pylist()) == [1, 2**40]
    version = len(history) - 1
    assert sink.check(second, {"o": {0: 1}})  # a replay: nothing to write, nothing to widen
    assert spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").count() - 1 == version


def test_the_delta_spark_sink_keeps_fence_replay_and_read_back_with_deltalake_unimportable(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # I14: the sink reads and writes through Spark alone; with kafka_delta refused any import
    # of deltalake, the check, the commit, the replay and the fence all hold.
    from kafka_delta.offsets.fencing import FencingError
    from test_spark_only import refuse_delta_rs_in_the_engine

    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    refuse_delta_rs_in_the_engine(monkeypatch)
    sink = new_sink()
    sink.commit_batch(_ids(spark, 1), BatchCommit("p", "p.q", 0, {"o": {0: 1}}), {})
    sink, rival = new_sink(), new_sink()
    second = BatchCommit("p", "p.q", 1, {"o": {0: 3}})
    assert not sink.check(second, {"o": {0: 1}})
    assert sink.commit_batch(_ids(spark, 2, 3), second, {"o": {0: 1}}).rows == 2
    assert sink.check(second, {"o": {0: 1}})  # a replay
    with pytest.raises(FencingError, match="another run of the pipeline moved the table on"):
        rival.commit_batch(_ids(spark, 9), BatchCommit("p", "p.r", 0, {"o": {0: 2}}), {"o": {0: 1}})
    assert sorted(r.id for r in spark.read.format("delta").load(uri).collect()) == [1, 2, 3]
    assert not (Path(uri) / "_kafka_delta").exists()  # nothing of the engine's in the table
    assert list((tmp_path / "checkpoint.kafka_delta" / "p" / "commits").rglob("*.json"))


def _overtaken(spark, run_a, run_b) -> tuple[BatchCommit, object]:
    """Run B checks its batch 0 on top of run A's batch 0, then run A commits the same range
    before run B writes: (run B's batch, run A's second result)."""
    run_a.commit_batch(_ids(spark, 1), BatchCommit("p", "p.run-a", 0, {"o": {0: 1}}), {})
    late = BatchCommit("p", "p.run-b", 0, {"o": {0: 3}})
    assert not run_b.check(late, {"o": {0: 1}})  # the table ends where run B starts...
    # ...until run A commits the same range between run B's check and its write.
    taken = run_a.commit_batch(
        _ids(spark, 2, 3), BatchCommit("p", "p.run-a", 1, {"o": {0: 3}}), {"o": {0: 1}}
    )
    return late, taken


def test_a_delta_spark_run_that_another_run_overtakes_after_its_check_writes_nothing(
    spark, tmp_path: Path
) -> None:
    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    from kafka_delta.offsets.fencing import FencingError

    run_a, run_b = new_sink(), new_sink()
    late, _ = _overtaken(spark, run_a, run_b)

    with pytest.raises(FencingError, match="lost to a concurrent run"):
        run_b.commit_batch(_ids(spark, 20, 30), late, {"o": {0: 1}})

    assert sorted(r.id for r in spark.read.format("delta").load(uri).collect()) == [1, 2, 3]


def test_an_upsert_overtaken_after_its_check_is_fenced_though_its_session_committed_before(
    spark, tmp_path: Path
) -> None:
    # A MERGE's rows are counted before it, so only the session's last commit version tells
    # whether it committed (CommitWatch): that version must be unset before the MERGE, or a
    # MERGE delta-spark skipped (its fence seq already used) takes the session's previous
    # commit, here run A's, for its own and claims the batch written.
    from kafka_delta.engine import WriteMode
    from kafka_delta.offsets.fencing import FencingError

    uri, new_sink = _delta_spark_sink(spark, tmp_path, WriteMode("upsert", keys=("id",)))
    run_a, run_b = new_sink(), new_sink()
    late, taken = _overtaken(spark, run_a, run_b)
    assert taken.written and taken.delta_version == 1 and taken.read_back_s == 0.0

    with pytest.raises(FencingError, match="lost to a concurrent run"):
        run_b.commit_batch(_ids(spark, 1, 20), late, {"o": {0: 1}})

    assert sorted(r.id for r in spark.read.format("delta").load(uri).collect()) == [1, 2, 3]


def test_a_commit_of_another_writer_in_the_batchs_session_is_never_taken_for_the_batchs(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch's session is its own inside foreachBatch; were another writer to commit in it
    # while delta-spark skipped the batch's write, the session's last commit version would be
    # that writer's. The rows observed in the write's own job are the second proof: a skipped
    # write never runs it, so its observation stays unset, and after a bounded wait (not
    # Observation.get's unbounded one: the batch would hang) the log is read back.
    import kafka_delta.delta.spark_commit as spark_commit
    from kafka_delta.delta.spark_table import SparkTable
    from kafka_delta.offsets.fencing import FencingError

    uri, new_sink = _delta_spark_sink(spark, tmp_path)
    run_a, run_b = new_sink(), new_sink()
    late, _ = _overtaken(spark, run_a, run_b)
    other = str(tmp_path / "other")
    for version in range(3):  # the other table's next commit is version 3: above the stored 1
        _ids(spark, version).write.format("delta").mode("append").save(other)
    real_save = SparkTable.save

    def save_then_another_writer_commits(table: SparkTable, writer) -> None:
        real_save(table, writer)
        _ids(spark, 99).write.format("delta").mode("append").save(other)

    monkeypatch.setattr(SparkTable, "save", save_then_another_writer_commits)
    monkeypatch.setattr(spark_commit, "OBSERVED_WAIT_S", 1.0)

    with pytest.raises(FencingError, match="lost to a concurrent run"):
        run_b.commit_batch(_ids(spark, 20, 30), late, {"o": {0: 1}})

    assert spark.conf.get(spark_commit.LAST_COMMIT_CONF) == "3"
    assert sorted(r.id for r in spark.read.format("delta").load(uri).collect()) == [1, 2, 3]


@pytest.mark.parametrize("compactor", ["delta_spark", "delta_rs"])
def test_an_upsert_whose_merge_loses_to_a_compaction_is_written_again_and_lands_once(
    spark, tmp_path: Path, compactor: str
) -> None:
    # A compaction that commits while a batch's MERGE runs (`table maintain`, another job's
    # OPTIMIZE) makes delta-spark refuse the MERGE's commit: Delta's own OPTIMIZE removed files
    # the MERGE read (ConcurrentDeleteReadException), delta-rs's added files it should have
    # read (ConcurrentAppendException). No run of the pipeline committed, so the batch is
    # written again on the table as it is now. It used to stop the run as fenced ("lost to a
    # concurrent run", exit 3), or with Delta's raw error.
    import threading
    import time

    from deltalake import DeltaTable
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    from kafka_delta.engine import WriteMode
    from kafka_delta.offsets.stored import newest_stored
    from kafka_delta.runtime.spark_session import session_of_its_own

    uri, new_sink = _delta_spark_sink(spark, tmp_path, WriteMode("upsert", keys=("id",)))
    sink = new_sink()
    sink.commit_batch(_ids(spark, 1, 2), BatchCommit("p", "p.q", 0, {"o": {0: 2}}), {})
    sink.commit_batch(_ids(spark, 3), BatchCommit("p", "p.q", 1, {"o": {0: 3}}), {"o": {0: 2}})
    asked, done = tmp_path / "compact", tmp_path / "compacted"

    def compacting_once(value):  # no type hints: pyspark would look for an Arrow UDF in them
        # Evaluated inside the MERGE, after it took its snapshot: the first call has the table
        # compacted, by this Python worker through delta-rs or by the driver through Spark.
        try:
            asked.touch(exist_ok=False)
        except FileExistsError:
            return value
        if compactor == "delta_rs":
            DeltaTable(uri).optimize.compact()
            done.touch()
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return value

    def optimize_when_asked() -> None:
        own = session_of_its_own(spark)  # as the run's compaction: not the MERGE's confs
        deadline = time.monotonic() + 60
        while not asked.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            own.sql(f"OPTIMIZE delta.`{uri}`").collect()
        finally:
            done.touch()

    driver = threading.Thread(target=optimize_when_asked, daemon=True)
    if compactor == "delta_spark":
        driver.start()
    else:
        driver = None
    compacting = F.udf(compacting_once, LongType())
    frame = _ids(spark, 2, 4).select(compacting("id").alias("id"))

    result = sink.commit_batch(frame, BatchCommit("p", "p.q", 2, {"o": {0: 5}}), {"o": {0: 3}})

    if driver is not None:
        driver.join(60)
    assert done.exists()
    history = DeltaTable(uri).history()
    operations = [h["operation"] for h in reversed(history)]
    assert operations == ["WRITE", "MERGE", "OPTIMIZE", "MERGE"], operations
    assert result.written and result.delta_version == 3 and result.rows == 2
    assert sorted(r.id for r in spark.read.format("delta").load(uri).collect()) == [1, 2, 3, 4]
    page = [{"version": h["version"], "userMetadata": h.get("userMetadata")} for h in history]
    stored = newest_stored(page, "p")
    assert stored is not None and (stored.batch_id, stored.delta_version) == (2, 3)


def test_each_refusal_delta_gives_a_commit_that_lost_a_race_is_judged_as_a_lost_race() -> None:
    # Delta 4.4 refuses a MERGE that a compaction overtook with ConcurrentAppendException (the
    # test above); Delta's other refusals of a commit that raced another writer, by class or by
    # error class, are judged the same way: read back, the batch is fenced, a replay, or
    # written again. Anything else is no race.
    refusals = [
        "ConcurrentAppendException: [DELTA_CONCURRENT_APPEND.WITHOUT_HINT] Transaction conflict",
        "ConcurrentDeleteReadException: [DELTA_CONCURRENT_DELETE_READ] Transaction conflict",
        "ConcurrentDeleteDeleteException: [DELTA_CONCURRENT_DELETE_DELETE] Transaction conflict",
        "ConcurrentWriteException: [DELTA_CONCURRENT_WRITE] Transaction conflict",
        "ConcurrentTransactionException: [DELTA_CONCURRENT_TRANSACTION] Transaction conflict",
        "MetadataChangedException: [DELTA_METADATA_CHANGED] Transaction conflict",
        "ProtocolChangedException: [DELTA_PROTOCOL_CHANGED] Transaction conflict",
    ]
    for refusal in refusals:
        exc = RuntimeError(
            f"An error occurred while calling o48.sql.\n: io.delta.exceptions.{refusal}"
        )
        assert lost_race(exc), refusal
    assert not lost_race(RuntimeError("[DELTA_TABLE_NOT_FOUND] Delta table does not exist"))
