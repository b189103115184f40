"""The Spark session a run (or a command that needs Spark) starts, as the config says."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kafka_delta.config import PipelineConfig
from kafka_delta.runtime import jvm_archive
from kafka_delta.runtime.python_launcher import use_for_spark

log = logging.getLogger(__name__)

# Parquet that every Delta reader reads back. Spark writes timestamps as INT96 by default, which
# Arrow-based readers (deltalake, polars, DuckDB) read as nanoseconds: a timestamp outside
# 1677-2262 then fails to read ("Casting from timestamp[ns] ... would lose data"). INT64
# microseconds is Delta's own timestamp type (what delta-rs writes), and CORRECTED keeps dates
# before 1582 in the proleptic Gregorian calendar every other reader uses. Session confs, so
# they hold under Spark Connect too; a key the config's spark.conf sets is the config's.
READABLE_PARQUET = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
}


# The Kafka options whose values are secrets, by the keys the engine hands Spark: the embedded
# source's ``kafkaConfig`` (every librdkafka setting of kafka.client, passwords and inline PEM
# keys among them), and Spark's kafka source's ``kafka.<key>`` options of kafka.jvm_client
# (``sasl.jaas.config`` holds the password inside its value; ``ssl.keystore.key`` an inline
# private key). Spark prints a source's options wherever it prints its plan (``explain``, the
# UI, a failure's plan), redacting those whose key or value matches
# ``spark.sql.redaction.options.regex`` or ``spark.redaction.regex``; Spark's defaults catch
# "password" and "secret" in a value, not an inline key, and a platform or user may set others.
KAFKA_SECRET_OPTIONS = (
    r"kafkaConfig|kafka\.sasl\.jaas\.config|"
    r"kafka\..*(?:password|secret|token|credentials|\.key|\.pem)"
)
OPTIONS_REDACTION = "spark.sql.redaction.options.regex"


def redact_kafka_options(spark) -> None:
    """Add :data:`KAFKA_SECRET_OPTIONS` to the session's ``spark.sql.redaction.options.regex``
    (a session conf: classic and Connect sessions alike, the platform's too), keeping what it
    redacts already. Called where the engine builds a session and where it hands a source its
    options, so that no session it reads Kafka in prints a secret of them."""
    current = spark.conf.get(OPTIONS_REDACTION, None) or ""
    if KAFKA_SECRET_OPTIONS in current:
        return
    ours = f"(?i:{KAFKA_SECRET_OPTIONS})"
    spark.conf.set(OPTIONS_REDACTION, f"(?:{current})|{ours}" if current else ours)


def use_readable_parquet(spark, configured: dict[str, str] | None = None) -> None:
    """Set :data:`READABLE_PARQUET` on ``spark`` (classic or Connect), but the keys
    ``configured`` (the config's ``spark.conf``) names."""
    for key, value in READABLE_PARQUET.items():
        if key not in (configured or {}):
            spark.conf.set(key, value)


def submitted_master() -> str | None:
    """The master this process was started with by a submitter, or None for a plain
    ``python -m`` run (no JVM yet: this process will start one).

    Told by how the process was started, never by ``SparkConf`` alone: before the JVM gateway is
    attached, ``SparkConf().contains("spark.master")`` is False even under ``spark-submit
    --master yarn``, so a run that asked it took the config's ``local[2]`` and never reached the
    cluster. spark-submit hands its Python driver a running JVM (``PYSPARK_GATEWAY_PORT``) whose
    conf holds the master it was given (``--master``, ``--conf spark.master``, ``MASTER``, else
    its own default ``local[*]``); Databricks and any caller that made a session first have a
    SparkContext already."""
    from pyspark import SparkConf, SparkContext

    active = SparkContext._active_spark_context
    if active is not None:
        return str(active.master)
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    SparkContext._ensure_initialized()  # attaches to the JVM spark-submit started
    return SparkConf().get("spark.master", "local[*]")


def is_local_master(master: str | None) -> bool:
    """Whether executors run on this machine: ``local``, ``local[N]``, ``local-cluster[...]``,
    or no master at all (Spark's default, ``local[*]``)."""
    return master is None or master.startswith("local")


def build_spark(config: PipelineConfig, log4j_config: Path | None = None):
    """The Spark session; ``log4j_config`` (``conf/log4j2.properties``) configures Spark's
    logging when this process starts Spark's JVM itself (a plain ``python -m`` run), as
    ``scripts/run_local.sh`` does for spark-submit; such a run with a local master also maps the
    class archive of Spark's classes when one exists (:mod:`kafka_delta.runtime.jvm_archive`).

    The master is the submitter's wherever there is one (spark-submit's ``--master``, a
    cluster manager, Databricks): the config's ``spark.master`` applies to a plain ``python -m``
    run only (:func:`submitted_master`)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"kafka-delta-{config.pipeline_id}")
    conf = dict(config.spark.conf)
    remote = config.spark.remote or os.environ.get("SPARK_REMOTE")
    if remote:
        # Spark Connect: the server owns the master, the JVM and its static confs; the
        # session confs of the config still apply to this session.
        builder = builder.remote(remote)
        spark = builder.getOrCreate()
        for key, value in conf.items():
            try:
                spark.conf.set(key, value)
            except Exception as exc:  # a static conf: the server's to set
                log.warning("spark.conf %s is not settable on a Connect session: %s", key, exc)
        use_readable_parquet(spark, config.spark.conf)
        redact_kafka_options(spark)
        return spark
    master = submitted_master()
    if master is None and config.spark.master:
        master = config.spark.master
        builder = builder.master(master)
        options = []
        if log4j_config is not None and log4j_config.is_file():
            options.append(f"-Dlog4j2.configurationFile=file:{log4j_config.resolve()}")
        if master.startswith("local"):
            # Spark's classes mapped from the class archive a local run recorded: ~2.5 s sooner.
            options += jvm_archive.mapping_options()
        # The config's own driver options (spark.conf) join these, after them so that theirs
        # win where both set one: set alone, they would drop the log configuration and the
        # class archive without a word.
        own = conf.pop("spark.driver.extraJavaOptions", "").strip()
        joined = " ".join(part for part in (jvm_archive.option_string(options), own) if part)
        if joined:
            builder = builder.config("spark.driver.extraJavaOptions", joined)
    if is_local_master(master):
        # Spark's Python workers must run this interpreter, where the package is importable,
        # and import the installed, compiled pyspark rather than Spark's source zip
        # (python_launcher). Only where they run on this machine: the launcher is a file in
        # this machine's cache, and a cluster's executors run the Python the submitter named
        # (spark.pyspark.python, PYSPARK_PYTHON), even when it has this interpreter's path.
        use_for_spark()
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    use_readable_parquet(spark, config.spark.conf)
    redact_kafka_options(spark)
    if not is_connect(spark):  # a Connect session (the platform's) has no SparkContext
        context = spark.sparkContext
        context.setLogLevel("WARN")
        # Where the run goes: the master (the submitter's, else the config's) and the Python
        # the executors start, which a cluster's nodes must have.
        log.info("spark: master %s, executors' Python %s", context.master, context.pythonExec)
    return spark


def is_connect(spark: object) -> bool:
    """Whether ``spark`` is a Spark Connect session (serverless, standard access, a
    ``sc://`` server): no SparkContext, no JVM in this process, and ``foreachBatch`` runs in a
    Python process the server starts. Told by its class, without importing Connect's client
    (which needs grpc) where it is not in use."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


# Read tasks a micro-batch runs where the session cannot say how many cores it has (a Connect
# session to a cluster whose size Spark Connect does not expose): Kafka partitions are grouped
# or split to this many.
CONNECT_PARALLELISM = 8


def session_of_its_own(spark):
    """A clone of ``spark`` (its confs, temporary views and catalog state copied) whose SQL
    confs are its own from then on, for Delta commands beside the batches (the run's
    compaction); None, with the reason logged, where the server cannot clone one.

    A batch's MERGE carries its txn and record as session confs
    (:func:`kafka_delta.delta.spark_commit.delta_txn_confs`). Under Spark Connect the batch
    runs in the client's session (``foreachBatch``'s process joins it), so an OPTIMIZE in that
    session during the MERGE commits with the batch's txn and record: a commit that carries
    the batch's offsets and fence but none of its rows."""
    try:
        if is_connect(spark):
            return spark.cloneSession()
        from pyspark.sql import SparkSession

        return SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())
    except Exception as exc:
        log.warning("cannot clone the Spark session: %s", str(exc).splitlines()[0][:200])
        return None


def default_parallelism(spark: object) -> int:
    """Spark's default parallelism: the SparkContext's on a classic session; under Spark
    Connect (no SparkContext) ``spark.default.parallelism``, else a local master's core count
    (``local[N]``), else :data:`CONNECT_PARALLELISM`."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)  # type: ignore[attr-defined]
    conf = spark.conf  # type: ignore[attr-defined]
    configured = conf.get("spark.default.parallelism", None)
    if configured:
        return max(1, int(configured))
    master = conf.get("spark.master", None) or ""
    if master.startswith("local["):
        cores = master[len("local[") :].split(",")[0].rstrip("]")
        return os.cpu_count() or 1 if cores == "*" else max(1, int(cores))
    if master == "local":
        return 1
    return CONNECT_PARALLELISM


def streaming_query_id(spark: object) -> str | None:
    """Inside ``foreachBatch`` on a classic session, the running query's id (Spark's local
    property, which equals the id in the checkpoint's ``metadata`` file); None under Spark
    Connect, which has no SparkContext to ask (the caller reads the checkpoint instead)."""
    if is_connect(spark):
        return None
    context = spark.sparkContext  # type: ignore[attr-defined]
    return context.getLocalProperty("sql.streaming.queryId") or None
