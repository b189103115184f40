"""Builds the engine ``config.engine`` names: the one place that imports the implementations
(:mod:`.sources`, :mod:`.sinks`); :mod:`.engine` names the contract alone."""

from __future__ import annotations

import importlib

from pyspark.sql import SparkSession

from kafka_delta.config import PipelineConfig
from kafka_delta.dead_letters import DeadLetterQueue
from kafka_delta.engine import Engine, Source, WriteMode
from kafka_delta.runtime.connectors import (
    ConnectorMissingError,
    missing_connectors,
    required_connectors,
)


def build_source(config: PipelineConfig) -> Source:
    """The source ``config.engine.source`` names: ``embedded``, ``spark_kafka``, or
    ``module:Class``, a source of one's own built with the config."""
    if config.engine.source == "embedded":
        from kafka_delta.sources.embedded import EmbeddedSource

        return EmbeddedSource(config.kafka, idle_poll_s=config.trigger.idle_poll)
    if config.engine.source == "spark_kafka":
        from kafka_delta.sources.spark_kafka import SparkKafkaSource

        return SparkKafkaSource(config.kafka)
    module_name, _, class_name = config.engine.source.partition(":")
    try:
        source_class = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConnectorMissingError(
            f"engine.source {config.engine.source!r} cannot be imported ({exc})"
        ) from None
    return source_class(config)


def build_engine(
    spark: SparkSession, config: PipelineConfig, source: Source | None = None
) -> Engine:
    """The source, sink, offset store and dead-letter sink ``config.engine`` names; fails
    before any work when the session lacks the connector jars they need. ``source``: one
    already built (the tables of one pipeline share the stream it reads); ``config`` may be a
    view of one table (:meth:`.config.PipelineConfig.for_table`)."""
    missing = missing_connectors(
        spark, required_connectors(config.engine.source, config.engine.sink)
    )
    if missing:
        local = (
            "KAFKA_DELTA_JARS=<folder of delta-spark jars> scripts/run_local.sh"
            if config.engine.source == "embedded"
            else "scripts/run_cluster_local.sh (spark-submit --packages, or --jars from the "
            "folder KAFKA_DELTA_JARS names)"
        )
        raise ConnectorMissingError(
            f"engine {config.engine.name!r} needs the {' and '.join(missing)} jars, which this "
            f"Spark session does not have. On Databricks they are built in; locally run "
            f"{local}, or use engine: embedded."
        )
    mode = WriteMode(
        config.delta.mode,
        config.delta.merge_keys,
        config.delta.order_by,
        add_columns=config.delta.schema_evolution == "add_columns",
    )
    dead_table = config.dead_letter_table
    source = source if source is not None else build_source(config)

    options = config.delta.storage_options
    if config.engine.sink == "delta_rs":
        from kafka_delta.delta.rs_offset_store import DeltaRsOffsetStore
        from kafka_delta.sinks.delta_rs.sink import DeltaRsSink

        return Engine(
            source=source,
            sink=DeltaRsSink(
                config.delta.table,
                config.pipeline_id,
                options,
                mode=mode,
                spark_writes_files=config.delta.file_writer == "spark",
            ),
            offset_store=DeltaRsOffsetStore(config.delta.table, config.pipeline_id, options),
            dead_letter_sink=(
                DeltaRsSink(dead_table, config.pipeline_id, options) if dead_table else None
            ),
            dead_letter_offsets=(
                DeltaRsOffsetStore(dead_table, config.pipeline_id, options) if dead_table else None
            ),
        )
    from kafka_delta.delta.spark_offset_store import DeltaSparkOffsetStore
    from kafka_delta.sinks.delta_spark.sink import DeltaSparkSink

    checkpoint = config.checkpoint
    return Engine(
        source=source,
        sink=DeltaSparkSink(
            spark,
            config.delta.table,
            config.pipeline_id,
            mode=mode,
            storage_options=options,
            checkpoint=checkpoint,
        ),
        offset_store=DeltaSparkOffsetStore(
            spark, config.delta.table, config.pipeline_id, options, checkpoint=checkpoint
        ),
        dead_letter_sink=(
            DeltaSparkSink(
                spark,
                dead_table,
                config.pipeline_id,
                storage_options=options,
                checkpoint=checkpoint,
            )
            if dead_table
            else None
        ),
        dead_letter_offsets=(
            DeltaSparkOffsetStore(
                spark, dead_table, config.pipeline_id, options, checkpoint=checkpoint
            )
            if dead_table
            else None
        ),
    )


def build_engine_parts(
    spark: SparkSession, view: PipelineConfig, source: Source | None
) -> tuple[Engine, DeadLetterQueue]:
    """A table's engine, built on ``spark`` (``source``: the stream the tables share), and its
    dead-letter queue."""
    engine = build_engine(spark, view, source=source)
    queue = DeadLetterQueue(
        engine.dead_letter_sink, engine.dead_letter_offsets, view.delta.storage_options
    )
    return engine, queue
