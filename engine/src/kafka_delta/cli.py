"""The command line: the run command (stream the topics into the table) and the subcommands
(``offsets``, ``table``, ``report``). A project's entry point hands over to :func:`run` with its
own name; ``python -m kafka_delta`` does the same as ``kafka-delta``.

    <project> --env local --trigger available-now     # the run command
    <project> offsets show                            # a subcommand
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from kafka_delta.commands.arguments import add_config_options, build_config, log4j_config
from kafka_delta.config import ENGINE_PRESETS, ConfigError
from kafka_delta.progress.listeners import build_listeners, close_listeners

log = logging.getLogger(__name__)

DEFAULT_PROG = "kafka-delta"

# Subcommands: `<project> offsets show`, ... Each module has `main(argv, prog) -> int`; imported
# only when asked for, so the run command never loads them.
SUBCOMMANDS = {
    "offsets": "kafka_delta.commands.offsets",
    "table": "kafka_delta.commands.table",
    "report": "kafka_delta.commands.report",
}


def _parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    # No abbreviations (in every command's parser): scripts/run_local.sh looks for
    # --bootstrap-servers by its full name, and adds .broker.json's address when it is not
    # there, which would silently win over a `--bootstrap-server X` argparse took for it.
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=prog,
        description="Stream Kafka topics into a Delta table exactly once. Subcommands: "
        + ", ".join(f"{name} (see `{name} --help`)" for name in SUBCOMMANDS),
    )
    add_config_options(parser)
    parser.add_argument(
        "--trigger",
        choices=["available-now", "processing-time"],
        help="override trigger.mode: run until caught up, or continuously",
    )
    parser.add_argument(
        "--trigger-interval",
        type=float,
        metavar="SECONDS",
        help="override trigger.interval_seconds of a continuous run (0: the next batch as soon "
        "as the last one ends, the low-latency setting)",
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


def _subcommand(name: str, argv: list[str], prog: str) -> int:
    module = importlib.import_module(SUBCOMMANDS[name])
    return int(module.main(argv, prog=f"{prog} {name}"))


def main(argv: list[str] | None = None, prog: str = DEFAULT_PROG) -> int:
    """Run the command ``argv`` names (the run command, or a subcommand); its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:], prog)
    args = _parse_args(argv, prog)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # py4j logs an exception the batch function raised, with its traceback, before Spark hands
    # it back to run(): an expected outcome is reported once, in one sentence, by _failed.
    logging.getLogger("py4j.clientserver").addFilter(_not_expected)
    try:
        config = build_config(args, every_table=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Before Spark starts: a metrics port in use or a path not writable stops the run at once.
    try:
        listeners = build_listeners(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from kafka_delta.runtime.preflight import PreflightError, check

    try:
        # Before Spark starts: seconds, and one sentence when something is wrong.
        check(config, remote=config.spark.remote or os.environ.get("SPARK_REMOTE"))
    except PreflightError as exc:
        close_listeners(listeners)
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from kafka_delta.contract import TransformNotFoundError, load_transform, passthrough

    try:
        transform = load_transform(config.transform) if config.transform else passthrough
    except TransformNotFoundError as exc:
        close_listeners(listeners)
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from kafka_delta.pipeline import Pipeline
    from kafka_delta.runtime.connectors import ConnectorMissingError
    from kafka_delta.runtime.graceful_stop import StopSignals
    from kafka_delta.runtime.spark_session import build_spark

    pipelines: list[Pipeline] = []
    stop_requested: list[bool] = []

    def on_stop() -> None:
        stop_requested.append(True)
        for pipeline in pipelines:
            pipeline.request_stop()

    # From the start: a signal during the few seconds Spark takes to start also stops cleanly.
    try:
        with StopSignals(on_stop) as signals:
            spark = build_spark(config, log4j_config(args))
            signals.install()  # the SparkContext replaced the SIGINT handler with one of its own
            signals.forward_from_jvm(spark)
            try:
                pipeline = Pipeline(spark, config, transform, listeners=listeners)
            except ConnectorMissingError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            pipelines.append(pipeline)
            if stop_requested:
                pipeline.request_stop()
            try:
                summary = pipeline.run()
            except Exception as exc:
                return _failed(config.pipeline_id, exc, config.transform)
    finally:
        close_listeners(listeners)
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
        summary.commit_back_ms.mean,
    )
    return 0


# Exit codes: 0 done; 1 failed; 2 bad input, or a state the run refuses (one sentence, nothing
# written); 3 fenced: another run of the pipeline, or an operator, moved the table's offsets
# while this run was in a batch (nothing of the batch was written; a restart recovers);
# 4 unavailable: a service the run needs (Kafka, the Schema Registry) stayed down through the
# run's retries (nothing of the batch was written; start again once it is back).
EXIT_FAILED, EXIT_REFUSED, EXIT_FENCED, EXIT_UNAVAILABLE = 1, 2, 3, 4
# Expected outcomes: the exception's own sentence is the whole report.
_EXPECTED = {
    "FencingError": EXIT_FENCED,
    "CheckpointMismatchError": EXIT_REFUSED,
    "CheckpointInUseError": EXIT_REFUSED,
    "OffsetsExpiredError": EXIT_REFUSED,
    # Records the pipeline has not read are gone from Kafka (retention, DeleteRecords) and
    # kafka.fail_on_data_loss is on (I5).
    "DataLossError": EXIT_REFUSED,
    "DeadLetterError": EXIT_REFUSED,
    "TopicRecreatedError": EXIT_REFUSED,
    # The compute refuses the trigger (serverless: availableNow only).
    "TriggerNotSupportedError": EXIT_REFUSED,
    # The producers' schema changed in a way the table cannot follow, or gained fields with
    # delta.schema_evolution: fail; a schema file or registry answer that cannot be used.
    "SchemaIncompatibleError": EXIT_REFUSED,
    "SchemaChangedError": EXIT_REFUSED,
    "MessageSeenError": EXIT_REFUSED,
    "SchemaFileError": EXIT_REFUSED,
    "SchemaMismatchError": EXIT_REFUSED,
    # A table name whose catalog or schema does not exist, a path to a catalog-managed table,
    # a grant the principal lacks (kafka_delta.delta.spark_table).
    "TableAccessError": EXIT_REFUSED,
    "RegistryUnavailableError": EXIT_UNAVAILABLE,
    # The brokers stayed unreachable for kafka.unavailable_timeout_seconds (kafka/outage.py).
    "KafkaUnavailableError": EXIT_UNAVAILABLE,
    # The brokers refused the client's login or TLS handshake (kafka/refusals.py).
    "KafkaRefusedError": EXIT_REFUSED,
}


def _not_expected(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return exc is None or type(exc).__name__ not in _EXPECTED


def _failed(pipeline_id: str, exc: BaseException, transform: str | None = None) -> int:
    """Report a run that ended with ``exc``: one sentence and its exit code for an expected
    outcome (also when it comes back from Spark inside a StreamingQueryException, whose text
    holds the Python traceback of the batch function), else 1 and one line naming the Python
    exception behind it and whose code raised it (``transform``: the config's, which a frame
    of the user's code is told by; :mod:`.runtime.task_errors`), or Spark's own first line."""
    from kafka_delta.runtime.task_errors import describe

    for name, code in _EXPECTED.items():
        sentence = _raised(exc, name)
        if sentence is not None:
            print(f"error: {sentence}", file=sys.stderr)
            return code
    from kafka_delta.kafka.outage import kafka_down, records_lost

    # Spark's kafka source reports records gone from Kafka in its own text, with no exception
    # of ours to name it: the same expected outcome as the embedded source's DataLossError.
    lost = records_lost(str(exc))
    if lost is not None:
        print(f"error: {lost}", file=sys.stderr)
        return EXIT_REFUSED

    # Spark's kafka source reports an outage as the Java client's timeout, with no exception of
    # ours to name it: a run that ends on one (a stop requested while it waited the outage out)
    # is the same expected outcome as the embedded source's KafkaUnavailableError.
    down = kafka_down(exc)
    if down is not None:
        print(
            f"error: Kafka did not answer ({down}); nothing of the batch in flight was "
            "committed: start again once the brokers are back",
            file=sys.stderr,
        )
        return EXIT_UNAVAILABLE
    log.error(
        "pipeline %s failed: %s (--log-level DEBUG shows the whole failure)",
        pipeline_id,
        describe(exc, transform) or _root_message(exc),
    )
    log.debug("the failure in full", exc_info=exc)
    return EXIT_FAILED


def _raised(exc: BaseException, name: str) -> str | None:
    """The message of an exception of class ``name`` that ``exc`` is, or reports."""
    from kafka_delta.decoding.failures import reported

    return reported(exc, name)


def _root_message(exc: BaseException) -> str:
    """The first line that says what went wrong, not a wall of JVM stack."""
    text = str(exc)
    for line in text.splitlines():
        line = line.strip()
        if "Error:" in line or "Exception:" in line:
            return line
    return text.splitlines()[0] if text else type(exc).__name__


def run(prog: str = DEFAULT_PROG) -> None:
    """Entry point of a project's console script, ``spark-submit src/<pkg>/main.py`` and
    ``python -m kafka_delta``: :func:`main`, then leave with its real exit status, never one of
    interpreter teardown (see :mod:`.runtime.process_exit`). ``prog`` names the command in
    ``--help`` (the project's console script). Tests call :func:`main`, which returns."""
    from kafka_delta.runtime.process_exit import run_and_exit

    run_and_exit(lambda: main(prog=prog))
