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


def session_confs(confs: dict[str, str] | None = None) -> dict[str, str]:
    """The test session's Spark confs (``local_session``'s, and a local Connect server's),
    ``confs`` on top. Its JVM maps the class archive of Spark's classes that a local run
    recorded, if there is one (:mod:`kafka_delta.runtime.jvm_archive`): ~2.5 s sooner."""
    from kafka_delta.runtime import jvm_archive

    chosen = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.session.timeZone": "UTC",
        # as conf/local.yaml: streaming queries disable it anyway, with a warning
        "spark.sql.adaptive.enabled": "false",
        "spark.databricks.delta.snapshotPartitions": "2",  # as conf/local.yaml
    }
    if mapping := jvm_archive.mapping_options():
        chosen["spark.driver.extraJavaOptions"] = jvm_archive.option_string(mapping)
    return {**chosen, **(confs or {})}


def local_session(app_name: str, confs: dict[str, str] | None = None) -> SparkSession:
    """The session (one per process: ``getOrCreate``): ``local[2]`` with
    :func:`session_confs`."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in session_confs(confs).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def remote_session(url: str) -> SparkSession:
    """A Spark Connect session to the server at ``url`` (``sc://host:port``): no SparkContext,
    no JVM in this process, as on Databricks serverless and standard access compute."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).getOrCreate()
