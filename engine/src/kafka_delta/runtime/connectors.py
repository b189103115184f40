"""The cluster engine's JVM connectors (delta-spark, Spark's kafka source): which classes tell
they are there, where to get them, and why a session lacks them. Used by the factory, the run
scripts and the tests; imports no engine.

``python -m kafka_delta.runtime.connectors`` prints the Maven coordinates for
``spark-submit --packages``; ``python -m kafka_delta.runtime.connectors session-confs <folder>``
the ``--conf`` options of a local delta-spark session whose tables by name outlive the run.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

# The connectors' entry classes (what a missing jar fails to load).
CONNECTOR_CLASSES = {
    "delta-spark": "org.apache.spark.sql.delta.DeltaLog",
    "spark-sql-kafka": "org.apache.spark.sql.kafka010.KafkaSourceProvider",
}
# Session confs delta-spark needs outside Databricks (where they are preset).
DELTA_SESSION_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def catalog_session_confs(folder: str) -> dict[str, str]:
    """Spark's session catalog over a Hive metastore kept in ``folder`` (the project's ``data/``):
    tables by name (``default.orders``, :mod:`kafka_delta.table_names`) outlive the run, as Unity
    Catalog's do on Databricks. The metastore is Derby, embedded, and Spark's Hive support is
    shipped in pyspark (its jars: hive-metastore, derby): nothing to install. Managed tables go
    to ``<folder>/warehouse``, the metastore to ``<folder>/metastore_db``. With Delta's catalog
    (:data:`DELTA_SESSION_CONFS`) over it, ``CREATE TABLE ... USING delta`` and
    ``DeltaTable.forName`` work as on a cluster."""
    root = folder.rstrip("/")
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": f"{root}/warehouse",
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={root}/metastore_db;create=true"
        ),
    }


def local_delta_confs(folder: str) -> dict[str, str]:
    """Everything a local delta-spark session needs: Delta's extension and catalog, over the
    metastore of :func:`catalog_session_confs` in ``folder``."""
    return {**DELTA_SESSION_CONFS, **catalog_session_confs(folder)}


def connector_packages() -> list[str]:
    """Maven coordinates of the cluster engine's connectors matching the installed pyspark and
    delta-spark (Spark 4 is built for Scala 2.13), for ``spark-submit --packages``."""
    from importlib.metadata import version

    spark = version("pyspark")
    # delta-spark's own rule (delta/pip_utils.py, configure_spark_with_delta_pip, 4.4.0): the
    # artifact carries the Spark major.minor it is built for, io.delta:delta-spark_4.2_2.13 for
    # pyspark 4.2.x. That helper only hands back a SparkSession builder, so the rule is repeated.
    spark_major_minor = ".".join(spark.split(".")[:2])
    return [
        f"io.delta:delta-spark_{spark_major_minor}_2.13:{version('delta-spark')}",
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark}",
    ]


def connectors_missing_reason(missing: list[str], why: str | None = None) -> str:
    """What a test skipped for lack of connector jars reports, e.g. ``spark-sql-kafka jars not
    on the classpath: Maven (mvn) is not on PATH to fetch them``: it names exactly the
    connectors this session lacks, and ``why`` the machine has none."""
    return f"{' and '.join(missing)} jars not on the classpath" + (f": {why}" if why else "")


def local_connector_jars(folder: str) -> list[str]:
    """Absolute paths of every ``*.jar`` in ``folder``: connectors installed by hand (an
    air-gapped machine, a mirror), for ``spark.jars`` / ``spark-submit --jars``."""
    from pathlib import Path

    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConnectorMissingError(f"connector jar folder {folder!r} is not a directory")
    jars = sorted(str(j.resolve()) for j in path.glob("*.jar"))
    if not jars:
        raise ConnectorMissingError(f"connector jar folder {folder!r} holds no .jar file")
    return jars


class ConnectorMissingError(RuntimeError):
    """The configured engine needs JVM connector jars that this Spark session does not have."""


def missing_connectors(spark: SparkSession, needed: list[str]) -> list[str]:
    """Which of the ``needed`` connectors (keys of :data:`CONNECTOR_CLASSES`) this session
    cannot use. Asked through Spark's own API, so a Spark Connect session (Databricks
    serverless, standard access) answers as a classic one does: the connector's data source is
    resolved, and only Spark's ``DATA_SOURCE_NOT_FOUND`` counts as missing (a refused path, a
    missing option or a table that is not there mean the provider was found)."""
    return [name for name in needed if not _provider_found(spark, _PROBES[name])]


# The data source each connector provides, and a read Spark resolves it for (never one that
# reads data: resolving the provider is enough, and fails only when its jar is not there).
_PROBES = {"delta-spark": "delta", "spark-sql-kafka": "kafka"}
_NOT_FOUND = ("DATA_SOURCE_NOT_FOUND", "Failed to find data source", "ClassNotFoundException")


def _provider_found(spark: SparkSession, provider: str) -> bool:
    import tempfile
    from pathlib import Path

    probe = Path(tempfile.gettempdir()) / "kafka-delta-no-such-table"
    try:
        # Analysis resolves the provider (eagerly on a classic session; a Connect session
        # analyses when asked for the schema).
        reader = spark.read.format(provider)
        frame = reader.load(probe.as_uri()) if provider == "delta" else reader.load()
        frame.schema  # noqa: B018
    except Exception as exc:
        return not any(marker in str(exc) for marker in _NOT_FOUND)
    return True


def required_connectors(source: str, sink: str) -> list[str]:
    """The JVM connectors an engine mix needs (keys of :data:`CONNECTOR_CLASSES`)."""
    needed = []
    if sink == "delta_spark":
        needed.append("delta-spark")
    if source == "spark_kafka":
        needed.append("spark-sql-kafka")
    return needed


if __name__ == "__main__":  # scripts/run_local.sh and run_cluster_local.sh ask
    import sys

    if sys.argv[1:2] == ["session-confs"] and len(sys.argv) == 3:
        print(" ".join(f"--conf {k}={v}" for k, v in local_delta_confs(sys.argv[2]).items()))
    else:
        print(",".join(connector_packages()))
