"""kafka_delta: Kafka -> Delta Lake, exactly once, on PySpark. The engine a project generated
from the template runs; the project holds only its transform, its config and a few lines that
hand over to :func:`run`.

Everything a project may use is named here (``__all__``); the folders behind it are the
engine's own:

- ``offsets/``: the offsets stored in the table, the fencing rule, RESTOREs, topic identity;
- ``recovery/``: Spark's checkpoint judged against the table, the run lease;
- ``sources/``: the embedded Kafka source and Spark's kafka source;
- ``sinks/``: the delta-rs and delta-spark sinks, dead letters, upsert;
- ``delta/``: what both sinks, recovery and the commands share of the table: its locations,
  folder and side folder, the promotion rule, the table as each engine reaches it and the
  offsets read from its log;
- ``decoding/``: JSON, Avro and Protobuf into typed columns, the Schema Registry client;
- ``kafka/``: metadata queries and the consumer-group commit-back;
- ``commands/``: ``offsets``, ``table`` and ``report``, and the options they share;
- ``progress/``: each batch's figures, the progress file and Prometheus metrics;
- ``runtime/``: the Spark session, the process (signals, exit status) and its start-up.

Names are imported when first used: a Spark task that imports one module of the engine does
not import the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.4.0"

# name -> the module that defines it
_PUBLIC = {
    "run": "kafka_delta.cli",
    "main": "kafka_delta.cli",
    "Pipeline": "kafka_delta.pipeline",
    "RunSummary": "kafka_delta.progress.summary",
    "PipelineConfig": "kafka_delta.config",
    "ConfigError": "kafka_delta.config",
    "load_config": "kafka_delta.config",
    "Transform": "kafka_delta.contract",
    "load_transform": "kafka_delta.contract",
    "passthrough": "kafka_delta.contract",
    "parse_json_values": "kafka_delta.transforms",
    "decoded_events": "kafka_delta.transforms",
    "DEAD_LETTER_COLUMN": "kafka_delta.contract",
    "KAFKA_COLUMNS": "kafka_delta.contract",
    "KAFKA_SCHEMA": "kafka_delta.contract",
    "KAFKA_ARROW_SCHEMA": "kafka_delta.contract",
    "BatchProgress": "kafka_delta.progress.batch",
    "ProgressListener": "kafka_delta.progress.batch",
}

__all__ = [
    "DEAD_LETTER_COLUMN",
    "KAFKA_ARROW_SCHEMA",
    "KAFKA_COLUMNS",
    "KAFKA_SCHEMA",
    "BatchProgress",
    "ConfigError",
    "Pipeline",
    "PipelineConfig",
    "ProgressListener",
    "RunSummary",
    "Transform",
    "__version__",
    "decoded_events",
    "load_config",
    "load_transform",
    "main",
    "parse_json_values",
    "passthrough",
    "run",
]

if TYPE_CHECKING:
    from kafka_delta.cli import main, run
    from kafka_delta.config import ConfigError, PipelineConfig, load_config
    from kafka_delta.contract import (
        DEAD_LETTER_COLUMN,
        KAFKA_ARROW_SCHEMA,
        KAFKA_COLUMNS,
        KAFKA_SCHEMA,
        Transform,
        load_transform,
        passthrough,
    )
    from kafka_delta.pipeline import Pipeline
    from kafka_delta.progress.batch import BatchProgress, ProgressListener
    from kafka_delta.progress.summary import RunSummary
    from kafka_delta.transforms import decoded_events, parse_json_values


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'kafka_delta' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
