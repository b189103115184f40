"""Bad table input on the cluster engine gets one sentence and exit code 2, and writes nothing
(kafka_delta.delta.spark_table): a name whose catalog or schema does not exist, a path to
a table the catalog manages (use its name), a grant the principal lacks (a refused CREATE
TABLE). The sentences are checked on Spark's own exceptions where this machine can raise them
(a plain Spark session: its catalog answers for schemas and catalogs), and on the texts Delta
and Unity Catalog raise where it cannot; end to end where the delta-spark jars are."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kafka_delta.delta.spark_table import SparkTable, TableAccessError, access_problem

pytestmark = pytest.mark.spark


def test_a_name_whose_schema_does_not_exist_is_one_sentence_from_sparks_own_error(spark) -> None:
    with pytest.raises(TableAccessError) as caught:
        SparkTable(spark, "kd_no_such_schema.orders").exists()
    sentence = str(caught.value)
    assert sentence.startswith("delta.table kd_no_such_schema.orders: schema kd_no_such_schema ")
    assert "does not exist" in sentence and "CREATE SCHEMA `kd_no_such_schema`" in sentence
    assert "SCHEMA_NOT_FOUND" in sentence and "Nothing was written." in sentence
    assert "\n" not in sentence


def test_a_name_whose_catalog_does_not_exist_is_one_sentence_from_sparks_own_error(spark) -> None:
    with pytest.raises(TableAccessError) as caught:
        SparkTable(spark, "kd_no_such_catalog.sales.orders").exists()
    sentence = str(caught.value)
    assert "catalog kd_no_such_catalog does not exist" in sentence
    # The session catalog takes an unknown first part for a nested namespace (Unity Catalog
    # says NO_SUCH_CATALOG_EXCEPTION): either way the catalog is named.
    assert "Nested databases are not supported" in sentence and "\n" not in sentence


def test_a_name_in_a_schema_that_exists_is_simply_not_there_yet(spark) -> None:
    # The session catalog's default schema exists; the table does not: created on first write.
    assert SparkTable(spark, "default.kd_not_created_yet").exists() is False


# Texts as the platforms raise them: delta-spark's error class (delta-error-classes.json,
# DELTA_PATH_BASED_ACCESS_TO_CATALOG_MANAGED_TABLE_BLOCKED), Unity Catalog's on Databricks
# (INSUFFICIENT_PERMISSIONS, SQLSTATE 42501; a path overlapping a managed table's storage), and
# Hadoop's refusal of a folder the principal cannot write.
MANAGED_PATH_DELTA = (
    "org.apache.spark.sql.delta.DeltaIllegalStateException: "
    "[DELTA_PATH_BASED_ACCESS_TO_CATALOG_MANAGED_TABLE_BLOCKED] Path-based access is not allowed "
    "for Catalog-Managed table: s3://bucket/__unitystorage/tables/1b2c. Please access the table "
    "via its name and retry. SQLSTATE: KD00G"
)
MANAGED_PATH_UC = (
    "[INVALID_PARAMETER_VALUE.LOCATION_OVERLAP] Input path url 's3://bucket/__unitystorage/"
    "catalogs/9f/tables/1b2c' overlaps with managed storage within 'CheckPathAccess' call. "
    "SQLSTATE: 22023"
)
NO_GRANT_UC = (
    "[INSUFFICIENT_PERMISSIONS] Insufficient privileges:\nUser does not have CREATE TABLE on "
    "Schema 'main.sales'. SQLSTATE: 42501"
)
NO_GRANT_FS = "java.nio.file.AccessDeniedException: /warehouse/sales.db/orders: Permission denied"


class _SparkError(Exception):
    """Stands for a pyspark exception carrying the platform's text (its class is irrelevant to
    the mapping, which reads the text)."""


@pytest.mark.parametrize(
    ("text", "location", "says"),
    [
        (MANAGED_PATH_DELTA, "s3://bucket/__unitystorage/tables/1b2c", "use its name"),
        (MANAGED_PATH_UC, "s3://bucket/__unitystorage/catalogs/9f/tables/1b2c", "use its name"),
        (NO_GRANT_UC, "main.sales.orders", "lacks a grant"),
        (NO_GRANT_FS, "sales.orders", "lacks a grant"),
    ],
)
def test_a_managed_path_and_a_missing_grant_are_one_sentence_each(
    text: str, location: str, says: str
) -> None:
    problem = access_problem(_SparkError(text), location, "create")
    assert problem is not None
    sentence = str(problem)
    assert sentence.startswith(f"delta.table {location}")
    assert says in sentence and sentence.endswith("Nothing was written.")
    assert "\n" not in sentence


def test_other_failures_are_not_taken_for_bad_input() -> None:
    for text in (
        "io.delta.exceptions.ConcurrentAppendException: Files were added to the root of the table",
        "[DELTA_FAILED_TO_MERGE_FIELDS] Failed to merge fields 'v' and 'v'",
        "the table does not have column x",
    ):
        assert access_problem(_SparkError(text), "main.sales.orders", "write") is None


# -- end to end, where the delta-spark jars are ----------------------------------------------


def _run(spark, tmp_path: Path, table: str, capsys, bootstrap, new_topics) -> tuple[int, str]:
    """A run of the delta-spark sink on ``table``, against the session's broker and a topic of
    its own: the broker is up, so what stops the run is the table (the preflight reports an
    unreachable broker before Spark starts, ahead of anything only Spark can find)."""
    import yaml

    from conftest import skip_without_connectors
    from kafka_delta.cli import main
    from support import PROJECT

    engine = {"source": "embedded", "sink": "delta_spark"}
    skip_without_connectors(spark, engine)
    (topic,) = new_topics(1, partitions=1)
    data = yaml.safe_load((PROJECT / "conf" / "local.yaml").read_text())
    data.update(engine=engine, checkpoint=str(tmp_path / "cp"))
    data["delta"]["table"] = table
    data["kafka"].update(bootstrap_servers=bootstrap, topics=[topic])
    # The config moves out of the project: its schema file is named where it is.
    data["decoding"]["value"]["schema_file"] = str(PROJECT / "schemas" / "order_event.ddl")
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "run.yaml").write_text(yaml.safe_dump(data))
    status = main(["--config", str(conf / "run.yaml"), "--trigger", "available-now"])
    return status, capsys.readouterr().err


@pytest.mark.broker
def test_a_run_on_a_name_whose_schema_does_not_exist_stops_with_one_sentence(
    spark, tmp_path: Path, capsys: pytest.CaptureFixture[str], kafka_bootstrap, new_topics
) -> None:
    status, err = _run(
        spark, tmp_path, "kd_missing_schema.orders", capsys, kafka_bootstrap, new_topics
    )
    assert status == 2, err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "schema kd_missing_schema does not exist" in line
    assert "Traceback" not in err
    assert not spark.catalog.tableExists("kd_missing_schema.orders")


@contextmanager
def _refusing_schema(spark, tmp_path: Path, schema: str) -> Iterator[Path]:
    """A schema whose folder the storage refuses new tables in, as it refuses a principal
    without the grant: made read-only (chmod), or immutable for root (chattr +i: root writes
    any folder a chmod guards), or, where neither holds, a file in its place. Put back after."""
    import subprocess

    folder = tmp_path / f"{schema}_location"
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {schema} LOCATION '{folder}'")
    folder.mkdir(exist_ok=True)
    undo = None
    if os.geteuid() != 0:
        folder.chmod(0o555)
        undo = lambda: folder.chmod(0o755)  # noqa: E731
    elif subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        undo = lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)  # noqa: E731
    else:
        folder.rmdir()
        folder.write_text("not a folder")
    try:
        yield folder
    finally:
        if undo is not None:
            undo()
        spark.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _nothing_in(folder: Path) -> bool:
    return folder.is_file() or not any(folder.iterdir())


def test_a_refused_create_table_is_one_sentence_from_sparks_own_error(
    spark, tmp_path: Path
) -> None:
    with _refusing_schema(spark, tmp_path, "kd_refusing") as folder:
        with pytest.raises(Exception) as caught:
            spark.sql("CREATE TABLE kd_refusing.orders USING parquet AS SELECT 1 AS id")
        assert _nothing_in(folder)
    problem = access_problem(caught.value, "kd_refusing.orders", "create")
    assert problem is not None, str(caught.value)[:2000]
    sentence = str(problem)
    assert "Spark was refused to create the table" in sentence and "lacks a grant" in sentence
    assert "\n" not in sentence and sentence.endswith("Nothing was written.")


@pytest.mark.broker
def test_a_refused_create_table_is_a_missing_grant_in_one_sentence(
    spark, tmp_path: Path, capsys: pytest.CaptureFixture[str], kafka_bootstrap, new_topics
) -> None:
    """End to end: the run's CREATE TABLE (delta-spark's createIfNotExists) is refused by the
    storage (on Databricks, Unity Catalog refuses it without the grant)."""
    from conftest import skip_without_connectors

    skip_without_connectors(spark, {"source": "embedded", "sink": "delta_spark"})
    with _refusing_schema(spark, tmp_path, "kd_locked") as folder:
        status, err = _run(spark, tmp_path, "kd_locked.orders", capsys, kafka_bootstrap, new_topics)
        assert _nothing_in(folder)
    assert status == 2, err
    assert "lacks a grant" in err and "Traceback" not in err
