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
import importlib
import logging
import os

from .config import ENGINE_PRESETS, ConfigError, PipelineConfig, load_config
from .progress import ProgressListener
from .python_launcher import use_for_spark

# spark-submit runs this file as __main__: name the logger after the module all the same.
log = logging.getLogger(f"{__package__}.main" if __name__ == "__main__" else __name__)


# Subcommands: `<script> offsets show`, ... Each module has `main(argv) -> int`; imported only
# when asked for, so the run command never loads them.
SUBCOMMANDS = {
    "offsets": "commands.offsets",
    "table": "commands.table",
    "report": "commands.report",
}


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """The options that choose the config, shared by the run command and the subcommands."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--env", default="local", help="use conf/<ENV>.yaml (default: local)")
    where.add_argument("--config", type=Path, help="path of a YAML config file")
    parser.add_argument("--bootstrap-servers", help="override kafka.bootstrap_servers")
    parser.add_argument("--consumer-group", help="override kafka.consumer_group")
    parser.add_argument("--table", help="override delta.table (path or URI)")
    parser.add_argument("--checkpoint", help="override checkpoint (path)")
    parser.add_argument(
        "--schema-registry-url", help="override decoding.schema_registry.url (Avro, Protobuf)"
    )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=__package__,
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


def _log4j_config(args: argparse.Namespace) -> Path:
    """Spark's logging for a plain ``python -m`` run: ``log4j2.properties`` beside the config
    file, else the project's ``conf/log4j2.properties`` (a config kept elsewhere still gets the
    filters that keep an expected failure to one sentence)."""
    beside = _config_path(args).parent / "log4j2.properties"
    return beside if beside.is_file() else Path.cwd() / "conf" / "log4j2.properties"


def _absolute(path: str | None) -> str | None:
    if path is None or "://" in path or path.startswith("dbfs:"):
        return path
    return str(Path(path).expanduser().resolve())


# The bootstrap address the template's local config ships with: where a developer's broker is
# assumed, unless scripts/broker.sh started one on a free port (its address in .broker.json).
_LOCAL_BOOTSTRAP = frozenset({"127.0.0.1:9092", "localhost:9092"})


def _broker_state_path(config_path: Path) -> Path | None:
    """The project's ``.broker.json`` (scripts/broker.sh start wrote it), if there is one. The
    project root is the folder holding ``conf/``, as load_config resolves paths."""
    root = config_path.resolve().parent
    if root.name == "conf":
        root = root.parent
    state_path = root / ".broker.json"
    return state_path if state_path.is_file() else None


def _started_broker(config_path: Path, configured: str) -> str | None:
    """The address of the broker ``scripts/broker.sh start`` recorded in the project's
    ``.broker.json``, when the config names the default local address and that broker still
    runs; None otherwise. The console script then finds it as the scripts do (one line on
    stderr says so)."""
    if configured not in _LOCAL_BOOTSTRAP:
        return None
    state_path = _broker_state_path(config_path)
    if state_path is None:
        return None
    # Only here: a project without a started broker (a cluster job) never imports devtools.
    from .devtools.broker import BrokerError, _read_state, _running

    try:
        state = _read_state(state_path)
    except BrokerError as exc:
        print(f"ignoring {state_path}: {exc}", file=sys.stderr)
        return None
    if state is None:
        return None
    if not _running(state):
        print(
            f"ignoring {state_path}: its broker (pid {state['pid']}) is no longer running; "
            f"using kafka.bootstrap_servers {configured}",
            file=sys.stderr,
        )
        return None
    address = str(state["bootstrap_servers"])
    print(
        f"using the broker scripts/broker.sh started, at {address} ({state_path}; "
        "--bootstrap-servers overrides)",
        file=sys.stderr,
    )
    return address


# The registry address the template's local config ships with (a project on Avro or Protobuf):
# replaced by the one scripts/broker.sh started, when there is one.
_LOCAL_REGISTRY = frozenset({"http://127.0.0.1:8081", "http://localhost:8081"})


def _started_registry(config_path: Path, configured: str) -> str | None:
    """The URL of the Schema Registry ``scripts/broker.sh start`` recorded in ``.broker.json``
    beside its broker, when the config names the default local address and it still runs."""
    if configured.rstrip("/") not in _LOCAL_REGISTRY:
        return None
    state_path = _broker_state_path(config_path)
    if state_path is None:
        return None
    from .devtools.broker import BrokerError, _read_state
    from .processes import pid_exists

    try:
        state = _read_state(state_path)
    except BrokerError:
        return None
    url, pid = (state or {}).get("schema_registry_url"), (state or {}).get("registry_pid")
    if not url or not isinstance(pid, int) or not pid_exists(pid):
        return None
    print(
        f"using the Schema Registry scripts/broker.sh started, at {url} ({state_path}; "
        "--schema-registry-url overrides)",
        file=sys.stderr,
    )
    return str(url)


def _registry_override(args: argparse.Namespace, path: Path, config: PipelineConfig) -> dict:
    registry = config.decoding.schema_registry
    url = getattr(args, "schema_registry_url", None)
    if url is None and registry is not None:
        url = _started_registry(path, registry.url)
    if url is None:
        return {}
    if registry is None:
        return {"decoding.schema_registry": {"url": url}}
    return {"decoding.schema_registry.url": url}


def build_config(args: argparse.Namespace) -> PipelineConfig:
    # ${NAME} references in the file (secrets such as SASL passwords) come from the environment.
    path = _config_path(args)
    config = load_config(path, environ=os.environ)
    bootstrap = args.bootstrap_servers or _started_broker(path, config.kafka.bootstrap_servers)
    return config.with_overrides(
        **_registry_override(args, path, config),
        **{
            "kafka.bootstrap_servers": bootstrap,
            "kafka.consumer_group": args.consumer_group,
            "delta.table": _absolute(args.table),
            "checkpoint": _absolute(args.checkpoint),
            # Run options; a subcommand's parser (add_config_options only) has none of them.
            "trigger.mode": getattr(args, "trigger", None) and args.trigger.replace("-", "_"),
            "kafka.max_records_per_trigger": getattr(args, "max_records_per_trigger", None),
            "engine": getattr(args, "engine", None),
        },
    )


def build_spark(config: PipelineConfig, log4j_config: Path | None = None):
    """The Spark session; ``log4j_config`` (``conf/log4j2.properties``) configures Spark's
    logging when this process starts Spark's JVM itself (a plain ``python -m`` run), as
    ``scripts/run_local.sh`` does for spark-submit."""
    # Spark's Python workers must run this interpreter, where the package is importable, and
    # import the installed, compiled pyspark rather than Spark's source zip (python_launcher).
    use_for_spark()
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


def build_listeners(config: PipelineConfig) -> list[ProgressListener]:
    """What receives each batch's progress, as the config says. The metrics module (and
    prometheus_client) is imported only when metrics are on. The metrics come first: a port
    in use stops the run before anything is written."""
    listeners: list[ProgressListener] = []
    try:
        metrics = config.metrics
        if metrics.exporter != "none":
            try:
                from .metrics import MetricsError, PrometheusMetrics
            except ImportError as exc:
                raise ConfigError(
                    f"metrics.exporter {metrics.exporter} needs the package prometheus-client, "
                    f"which is not installed ({exc})"
                ) from None
            try:
                listeners.append(
                    PrometheusMetrics(
                        config.pipeline_id,
                        http_address=(metrics.host, metrics.port)
                        if metrics.exporter == "http"
                        else None,
                        textfile=Path(metrics.textfile)
                        if metrics.exporter == "textfile" and metrics.textfile
                        else None,
                    )
                )
            except MetricsError as exc:
                raise ConfigError(str(exc)) from None
        if config.progress.path:
            from .progress_log import JsonLinesProgress

            try:
                listeners.append(JsonLinesProgress(Path(config.progress.path)))
            except OSError as exc:
                raise ConfigError(
                    f"progress.path: cannot write {config.progress.path}: {exc.strerror or exc}"
                ) from None
    except ConfigError:
        close_listeners(listeners)
        raise
    return listeners


def close_listeners(listeners: list[ProgressListener]) -> None:
    for listener in listeners:
        try:
            listener.close()
        except Exception as exc:
            log.warning("closing %s failed: %s", type(listener).__name__, exc)


def _subcommand(name: str, argv: list[str]) -> int:
    try:
        module = importlib.import_module(f"{__package__}.{SUBCOMMANDS[name]}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.{SUBCOMMANDS[name]}":
            raise
        print(f"error: the {name!r} subcommand is not part of this build", file=sys.stderr)
        return 2
    return int(module.main(argv))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # py4j logs an exception the batch function raised, with its traceback, before Spark hands
    # it back to run(): an expected outcome is reported once, in one sentence, by _failed.
    logging.getLogger("py4j.clientserver").addFilter(_not_expected)
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # Before Spark starts: a metrics port in use or a path not writable stops the run at once.
    try:
        listeners = build_listeners(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from .preflight import PreflightError, check

    try:
        check(config)  # before Spark starts: seconds, and one sentence when something is wrong
    except PreflightError as exc:
        close_listeners(listeners)
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from .connectors import ConnectorMissingError
    from .graceful_stop import StopSignals
    from .pipeline import Pipeline

    pipelines: list[Pipeline] = []
    stop_requested: list[bool] = []

    def on_stop() -> None:
        stop_requested.append(True)
        for pipeline in pipelines:
            pipeline.request_stop()

    # From the start: a signal during the few seconds Spark takes to start also stops cleanly.
    try:
        with StopSignals(on_stop) as signals:
            spark = build_spark(config, _log4j_config(args))
            signals.install()  # the SparkContext replaced the SIGINT handler with one of its own
            signals.forward_from_jvm(spark)
            try:
                pipeline = Pipeline(spark, config, listeners=listeners)
            except ConnectorMissingError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            pipelines.append(pipeline)
            if stop_requested:
                pipeline.request_stop()
            try:
                summary = pipeline.run()
            except Exception as exc:
                return _failed(config.pipeline_id, exc)
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
        sum(summary.commit_back_ms) / len(summary.commit_back_ms)
        if summary.commit_back_ms
        else 0.0,
    )
    return 0


# Exit codes: 0 done; 1 failed; 2 bad input, or a state the run refuses (one sentence, nothing
# written); 3 fenced: another run of the pipeline, or an operator, moved the table's offsets
# while this run was in a batch (nothing of the batch was written; a restart recovers);
# 4 unavailable: a service the run needs (the Schema Registry) stayed down through the run's
# retries (nothing of the batch was written; start again once it is back).
EXIT_FAILED, EXIT_REFUSED, EXIT_FENCED, EXIT_UNAVAILABLE = 1, 2, 3, 4
# Expected outcomes: the exception's own sentence is the whole report.
_EXPECTED = {
    "FencingError": EXIT_FENCED,
    "CheckpointMismatchError": EXIT_REFUSED,
    "OffsetsExpiredError": EXIT_REFUSED,
    "DeadLetterError": EXIT_REFUSED,
    "TopicRecreatedError": EXIT_REFUSED,
    # The producers' schema changed in a way the table cannot follow, or gained fields with
    # delta.schema_evolution: fail; a schema file or registry answer that cannot be used.
    "SchemaIncompatibleError": EXIT_REFUSED,
    "SchemaChangedError": EXIT_REFUSED,
    "SchemaFileError": EXIT_REFUSED,
    "SchemaMismatchError": EXIT_REFUSED,
    "RegistryUnavailableError": EXIT_UNAVAILABLE,
}


def _not_expected(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return exc is None or type(exc).__name__ not in _EXPECTED


def _failed(pipeline_id: str, exc: BaseException) -> int:
    """Report a run that ended with ``exc``: one sentence and its exit code for an expected
    outcome (also when it comes back from Spark inside a StreamingQueryException, whose text
    holds the Python traceback of the batch function), else the root message and 1."""
    for name, code in _EXPECTED.items():
        sentence = _raised(exc, name)
        if sentence is not None:
            print(f"error: {sentence}", file=sys.stderr)
            return code
    log.error(
        "pipeline %s failed: %s (--log-level DEBUG shows the whole failure)",
        pipeline_id,
        _root_message(exc),
    )
    log.debug("the failure in full", exc_info=exc)
    return EXIT_FAILED


def _raised(exc: BaseException, name: str) -> str | None:
    """The message of an exception of class ``name`` that ``exc`` is, or reports."""
    from .decoding.failures import reported

    return reported(exc, name)


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
