"""The options every command shares (which config, and overrides of it), and the config they
choose: the run command and the subcommands build their config the same way."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kafka_delta.config import ConfigError, PipelineConfig, load_config
from kafka_delta.kafka.clients import missing_file
from kafka_delta.runtime.local_services import started_broker, started_registry
from kafka_delta.table_names import is_table_name


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """The options that choose the config, shared by the run command and the subcommands."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--env", default="local", help="use conf/<ENV>.yaml (default: local)")
    where.add_argument("--config", type=Path, help="path of a YAML config file")
    parser.add_argument("--bootstrap-servers", help="override kafka.bootstrap_servers")
    parser.add_argument("--consumer-group", help="override kafka.consumer_group")
    parser.add_argument(
        "--table",
        help="override delta.table (path, URI or catalog.schema.table); with tables: in the "
        "config, the name of one table: the offsets and table commands act on it alone "
        "(default: on every table; the run command always writes every table and refuses it)",
    )
    parser.add_argument("--checkpoint", help="override checkpoint (path)")
    parser.add_argument(
        "--schema-registry-url", help="override decoding.schema_registry.url (Avro, Protobuf)"
    )


def config_path(args: argparse.Namespace) -> Path:
    if args.config is not None:
        return args.config
    return Path.cwd() / "conf" / f"{args.env}.yaml"


def log4j_config(args: argparse.Namespace) -> Path:
    """Spark's logging for a plain ``python -m`` run: ``log4j2.properties`` beside the config
    file, else the project's ``conf/log4j2.properties`` (a config kept elsewhere still gets the
    filters that keep an expected failure to one sentence)."""
    beside = config_path(args).parent / "log4j2.properties"
    return beside if beside.is_file() else Path.cwd() / "conf" / "log4j2.properties"


def absolute_path(path: str | None) -> str | None:
    """A relative path made absolute; a URI or a table name (:mod:`..table_names`) as given."""
    if path is None or "://" in path or path.startswith("dbfs:") or is_table_name(path):
        return path
    return str(Path(path).expanduser().resolve())


def _registry_override(args: argparse.Namespace, path: Path, config: PipelineConfig) -> dict:
    registry = config.decoding.schema_registry
    url = getattr(args, "schema_registry_url", None)
    if url is None and registry is not None:
        url = started_registry(path, registry.url)
    if url is None:
        return {}
    if registry is None:
        return {"decoding.schema_registry": {"url": url}}
    return {"decoding.schema_registry.url": url}


def selected_tables(config: PipelineConfig, args: argparse.Namespace) -> list[PipelineConfig]:
    """The tables a command acts on: of a config with ``tables:``, the one ``--table`` names,
    else every one (a view each, :meth:`PipelineConfig.for_table`); else the config itself."""
    if not config.tables:
        return [config]
    name = getattr(args, "table", None)
    return [config.for_table(name)] if name else config.table_configs()


def build_config(args: argparse.Namespace, *, every_table: bool = False) -> PipelineConfig:
    """The config the options choose. ``every_table``: the command acts on every table of
    ``tables:`` (the run command, which reads the topics once for all of them): ``--table``
    naming one of them is refused."""
    # ${NAME} references in the file (secrets such as SASL passwords) come from the environment.
    path = config_path(args)
    config = load_config(path, environ=os.environ)
    # A CA or key file the clients name that is not here: one sentence now, not librdkafka's
    # OpenSSL error when the first client starts (or the Java client's inside Spark's query).
    missing = missing_file(config.kafka.client, config.kafka.jvm_client)
    if missing is not None:
        raise ConfigError(missing)
    if config.tables and args.table is not None and every_table:
        raise ConfigError(
            f"--table {args.table}: the run command writes every table of tables: (one read of "
            "the topics for all of them), so it takes no --table; to run a table alone, give it "
            "a config of its own (its own pipeline_id and checkpoint)"
        )
    bootstrap = args.bootstrap_servers or started_broker(path, config.kafka.bootstrap_servers)
    table = absolute_path(args.table)
    if config.tables:
        # --table names one of the tables (checked here: an unknown name stops at once).
        if args.table is not None:
            config.for_table(args.table)
        table = None
    return config.with_overrides(
        **_registry_override(args, path, config),
        **{
            "kafka.bootstrap_servers": bootstrap,
            "kafka.consumer_group": args.consumer_group,
            "delta.table": table,
            "checkpoint": absolute_path(args.checkpoint),
            # Run options; a subcommand's parser (add_config_options only) has none of them.
            "trigger.mode": getattr(args, "trigger", None) and args.trigger.replace("-", "_"),
            "trigger.interval_seconds": getattr(args, "trigger_interval", None),
            "kafka.max_records_per_trigger": getattr(args, "max_records_per_trigger", None),
            "engine": getattr(args, "engine", None),
        },
    )
