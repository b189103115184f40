"""The local Spark session the engine's tests and the repo's harnesses run on: ``local[2]``,
UTC, UI off, two shuffle partitions, and the connector jars a machine has (a folder of them,
or Maven's packages), with the session confs delta-spark needs when its jars are there."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def connector_confs(jars_dir: str | None, packages: bool) -> dict[str, str]:
    """The Spark confs of the connector jars at hand: Maven's packages (``packages``) and every
    jar of the folder ``jars_dir``; {} when neither."""
    from kafka_delta.runtime.connectors import (
        DELTA_SESSION_CONFS,
        connector_packages,
        local_connector_jars,
    )

    confs: dict[str, str] = {}
    if packages:
        confs["spark.jars.packages"] = ",".join(connector_packages())
    if jars_dir:
        confs["spark.jars"] = ",".join(local_connector_jars(jars_dir))
    return {**confs, **DELTA_SESSION_CONFS} if confs else {}


def local_session(app_name: str, confs: dict[str, str] | None = None) -> SparkSession:
    """The session (one per process: ``getOrCreate``), with ``confs`` on top. Its JVM maps the
    class archive of Spark's classes that a local run recorded, if there is one
    (:mod:`kafka_delta.runtime.jvm_archive`): ~2.5 s sooner."""
    from pyspark.sql import SparkSession

    from kafka_delta.runtime import jvm_archive

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        # as conf/local.yaml: streaming queries disable it anyway, with a warning
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.databricks.delta.snapshotPartitions", "2")  # as conf/local.yaml
    )
    if mapping := jvm_archive.mapping_options():
        options = jvm_archive.option_string(mapping)
        builder = builder.config("spark.driver.extraJavaOptions", options)
    for key, value in (confs or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
