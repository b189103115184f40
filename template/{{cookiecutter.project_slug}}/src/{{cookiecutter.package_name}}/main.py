"""Entry point: ``spark-submit src/<pkg>/main.py``, the console script, or ``python -m <pkg>``
(all three call :func:`run`; :func:`main` is the same without leaving the process).

spark-submit src/<pkg>/main.py --env local --trigger available-now
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    # spark-submit runs this file as a plain script; make its relative imports work (PEP 366).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = Path(__file__).resolve().parent.name

import argparse
import logging
import os

from .config import ENGINE_PRESETS, ConfigError, PipelineConfig, load_config

# spark-submit runs this file as __main__: name the logger after the module all the same.
log = logging.getLogger(f"{__package__}.main" if __name__ == "__main__" else __name__)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=__package__,
        description="Stream Kafka topics into a Delta table exactly once.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--env", default="local", help="use conf/<ENV>.yaml (default: local)")
    where.add_argument("--config", type=Path, help="path of a YAML config file")
    parser.add_argument("--bootstrap-servers", help="override kafka.bootstrap_servers")
    parser.add_argument("--consumer-group", help="override kafka.consumer_group")
    parser.add_argument("--table", help="override delta.table (path or URI)")
    parser.add_argument("--checkpoint", help="override checkpoint (path)")
    parser.add_argument(
        "--trigger",
        choices=["available-now", "processing-time"],
        help="override trigger.mode: run until caught up, or continuously",
    )
    parser.add_argument(
        "--max-records-per-trigger", type=int, help="override kafka.max_records_per_trigger"
    )
    parser.add_argument(
        "--engine",
        choices=sorted(ENGINE_PRESETS),
        help="override engine: embedded (no connector jars) or cluster (Spark kafka + delta-spark)",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    return parser.parse_args(argv)


def _config_path(args: argparse.Namespace) -> Path:
    if args.config is not None:
        return args.config
    return Path.cwd() / "conf" / f"{args.env}.yaml"


def _absolute(path: str | None) -> str | None:
    if path is None or "://" in path or path.startswith("dbfs:"):
        return path
    return str(Path(path).expanduser().resolve())


def build_config(args: argparse.Namespace) -> PipelineConfig:
    # ${NAME} references in the file (secrets such as SASL passwords) come from the environment.
    config = load_config(_config_path(args), environ=os.environ)
    return config.with_overrides(
        **{
            "kafka.bootstrap_servers": args.bootstrap_servers,
            "kafka.consumer_group": args.consumer_group,
            "delta.table": _absolute(args.table),
            "checkpoint": _absolute(args.checkpoint),
            "trigger.mode": args.trigger.replace("-", "_") if args.trigger else None,
            "kafka.max_records_per_trigger": args.max_records_per_trigger,
            "engine": args.engine,
        }
    )


def build_spark(config: PipelineConfig, log4j_config: Path | None = None):
    """The Spark session; ``log4j_config`` (``conf/log4j2.properties``) configures Spark's
    logging when this process starts Spark's JVM itself (a plain ``python -m`` run), as
    ``scripts/run_local.sh`` does for spark-submit."""
    # Spark's Python workers must run this interpreter, where the package is importable.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"kafka-delta-{config.pipeline_id}")
    # Under spark-submit (or on Databricks) the master is already chosen; only a plain
    # `python -m` run takes the one from the config file.
    if config.spark.master and not SparkConf().contains("spark.master"):
        builder = builder.master(config.spark.master)
        if log4j_config is not None and log4j_config.is_file():
            builder = builder.config(
                "spark.driver.extraJavaOptions",
                f"-Dlog4j2.configurationFile=file:{log4j_config.resolve()}",
            )
    for key, value in config.spark.conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        spark.sparkContext.setLogLevel("WARN")
    except Exception:  # Spark Connect (Databricks shared/serverless compute) has no SparkContext
        log.debug("no SparkContext: leaving Spark's log level as configured")
    return spark


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from .preflight import PreflightError, check

    try:
        check(config)  # before Spark starts: seconds, and one sentence when something is wrong
    except PreflightError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from .engine import ConnectorMissingError
    from .graceful_stop import StopSignals
    from .pipeline import Pipeline

    pipelines: list[Pipeline] = []
    stop_requested: list[bool] = []

    def on_stop() -> None:
        stop_requested.append(True)
        for pipeline in pipelines:
            pipeline.request_stop()

    # From the start: a signal during the few seconds Spark takes to start also stops cleanly.
    with StopSignals(on_stop) as signals:
        spark = build_spark(config, _config_path(args).parent / "log4j2.properties")
        signals.install()  # the SparkContext replaced the SIGINT handler with one of its own
        signals.forward_from_jvm(spark)
        try:
            pipeline = Pipeline(spark, config)
        except ConnectorMissingError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        pipelines.append(pipeline)
        if stop_requested:
            pipeline.request_stop()
        try:
            summary = pipeline.run()
        except Exception as exc:
            log.error("pipeline %s failed: %s", config.pipeline_id, _root_message(exc))
            return 1
    stats = summary.commit_back
    log.info(
        "done: batches=%d replayed=%d rows=%d delta_version=%s commit_back_ok=%s "
        "commit_back_failed=%s commit_back_mean_ms=%s hook_mean_ms=%.3f",
        summary.batches,
        summary.replayed_batches,
        summary.rows_written,
        summary.last_delta_version,
        stats.succeeded if stats else "off",
        stats.failed if stats else "off",
        f"{stats.mean_commit_ms:.1f}" if stats else "off",
        sum(summary.commit_back_ms) / len(summary.commit_back_ms)
        if summary.commit_back_ms
        else 0.0,
    )
    return 0


def _root_message(exc: BaseException) -> str:
    """The first line that says what went wrong, not a wall of JVM stack."""
    text = str(exc)
    for line in text.splitlines():
        line = line.strip()
        if "Error:" in line or "Exception:" in line:
            return line
    return text.splitlines()[0] if text else type(exc).__name__


def run() -> None:
    """Entry point of the console script, ``python -m <pkg>`` and ``spark-submit main.py``:
    :func:`main`, then leave with its real exit status, never one of interpreter teardown
    (see :mod:`.process_exit`). Tests call :func:`main`, which returns the status."""
    from .process_exit import run_and_exit

    run_and_exit(main)


if __name__ == "__main__":
    run()
