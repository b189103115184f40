"""One Delta table as the cluster engine reaches it: through Spark alone (I14), by catalog name
(``main.sales.orders``: Unity Catalog on Databricks, the session catalog over a Hive metastore
locally) or by path (:mod:`kafka_delta.table_names` tells which).

Every read and write of the delta-spark sink, its offset store and the commands on a delta-spark
table goes through :class:`SparkTable`: ``DeltaTable.forName`` / ``forPath``, its
``history()``, the rows as ``spark.table(name)`` / ``spark.read.format("delta").load(path)``,
the writer's ``saveAsTable(name)`` / ``save(path)``. Nothing here opens a file, imports
delta-rs or touches Spark's JVM, so it runs where Python talks to Spark through Spark Connect
and where the platform gives storage credentials to Spark alone.

A table by name that does not exist yet is created before its first write with
``DeltaTable.createIfNotExists`` (the batch's columns and the sink's table properties): a
managed table in the schema the name gives. By path, the first append creates it, as before.

Bad input is one sentence (:class:`TableAccessError`, exit code 2 from the command line), found
from Spark's own error classes and messages (:func:`access_problem`), never a trace: a catalog
or schema that does not exist, a path that is a catalog-managed table (use its name), a grant
the principal lacks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from kafka_delta.table_names import is_table_name, name_parts, quoted

log = logging.getLogger(__name__)

# Columns of DESCRIBE HISTORY the readers use (kafka_delta.offsets.stored.TableLog.history).
HISTORY_COLUMNS = (
    "version",
    "timestamp",
    "operation",
    "operationParameters",
    "operationMetrics",
    "userMetadata",
    "engineInfo",
)
# Properties of the tables the sink creates by name (a table created by its first append, by
# path, gets Delta's defaults; a table that exists keeps its own).
NEW_TABLE_PROPERTIES: Mapping[str, str] = {}


def as_nullable(data_type: DataType) -> DataType:
    """``data_type`` with every field, element and value nullable: the schema delta-spark gives
    a table its first append creates (``ImplicitMetadataOperation``: ``schema.asNullable``), so a
    table created by name takes the rows a table created by path would."""
    if isinstance(data_type, StructType):
        return StructType(
            [StructField(f.name, as_nullable(f.dataType), True, f.metadata) for f in data_type]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(as_nullable(data_type.elementType), True)
    if isinstance(data_type, MapType):
        return MapType(as_nullable(data_type.keyType), as_nullable(data_type.valueType), True)
    return data_type


class TableAccessError(RuntimeError):
    """The table cannot be reached as configured (bad input): one sentence, nothing written."""


# (what Spark's message holds, what it means); the first that matches is taken. Spark's error
# classes (Spark 4: SCHEMA_NOT_FOUND 42704, CATALOG_NOT_FOUND 42P08), delta-spark's
# (DELTA_PATH_BASED_ACCESS_TO_CATALOG_MANAGED_TABLE_BLOCKED), the session catalog's refusal of a
# nested namespace, Unity Catalog's
# (NO_SUCH_CATALOG_EXCEPTION, INSUFFICIENT_PERMISSIONS 42501, PERMISSION_DENIED, a path that
# overlaps a managed table's storage) and the Hadoop file system's refusal.
_PROBLEMS: Sequence[tuple[tuple[str, ...], str]] = (
    # A three-part name whose first part is no catalog: Spark takes the first two parts for a
    # nested namespace of the session catalog, which it refuses.
    (
        (
            "CATALOG_NOT_FOUND",
            "NO_SUCH_CATALOG_EXCEPTION",
            "REQUIRES_SINGLE_PART_NAMESPACE",
            "Nested databases are not supported",
        ),
        "catalog",
    ),
    (("SCHEMA_NOT_FOUND", "NO_SUCH_SCHEMA", "DATABASE_NOT_FOUND"), "schema"),
    (
        (
            "PATH_BASED_ACCESS",
            "Path-based access is not allowed",
            "LOCATION_OVERLAP",
            "overlaps with managed storage",
        ),
        "managed",
    ),
    (
        (
            "INSUFFICIENT_PERMISSIONS",
            "PERMISSION_DENIED",
            "Insufficient privileges",
            "AccessControlException",
            "Permission denied",
            # The storage refusing the table's folder: Hadoop's file system says so alike for
            # a permission it lacks and a location it may not write (read-only, immutable, a
            # file where the folder goes); delta-spark when it cannot create the log.
            "Mkdirs failed to create",
            "ParentNotDirectoryException",
            "DELTA_CANNOT_CREATE_LOG_PATH",
        ),
        "grant",
    ),
)


def access_problem(exc: BaseException, location: str, action: str) -> TableAccessError | None:
    """The one sentence for Spark's error ``exc`` on ``location`` while ``action`` (``write``,
    ``read``, ``create``), or None when it is no bad input of the config's (a failure to report
    as it is)."""
    text = f"{type(exc).__name__}: {exc}"
    kind = next((k for marks, k in _PROBLEMS if any(m in text for m in marks)), None)
    if kind is None:
        return None
    first = text.splitlines()[0][:300]
    parts = name_parts(location) if is_table_name(location) else []
    if kind == "catalog":
        where = f"catalog {parts[0]}" if len(parts) == 3 else "its catalog"
        sentence = (
            f"delta.table {location}: {where} does not exist; create it, or name a catalog "
            f"that exists (Spark: {first})."
        )
    elif kind == "schema":
        schema = ".".join(parts[:-1]) if parts else "its schema"
        sentence = (
            f"delta.table {location}: schema {schema} does not exist; create it (CREATE SCHEMA "
            f"{quoted(schema) if parts else '...'}) or name one that exists (Spark: {first})."
        )
    elif kind == "managed":
        sentence = (
            f"delta.table {location} is the path of a table the catalog manages, which Spark "
            f"reaches only by name: use its name (catalog.schema.table) (Spark: {first})."
        )
    else:
        sentence = (
            f"delta.table {location}: Spark was refused to {action} the table: the principal "
            f"running the pipeline lacks a grant on it or may not write its location (on Unity "
            f"Catalog: USE CATALOG, USE SCHEMA, and CREATE TABLE to create it or MODIFY and "
            f"SELECT to write it) (Spark: {first})."
        )
    return TableAccessError(f"{sentence} Nothing was written.")


class SparkTable:
    """One Delta table, by name or by path, reached through Spark (see the module docstring)."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.spark = spark
        self.location = location
        self.name = location if is_table_name(location) else None

    def _failed(self, exc: Exception, action: str) -> Exception:
        return access_problem(exc, self.location, action) or exc

    def exists(self) -> bool:
        """Whether the table exists. By name, its catalog and schema must exist (a
        :class:`TableAccessError` when they do not: a missing table is created, a missing
        schema is the config's mistake)."""
        from delta.tables import DeltaTable

        try:
            if self.name is None:
                return bool(DeltaTable.isDeltaTable(self.spark, self.location))
            parts = name_parts(self.name)
            self.spark.sql(f"DESCRIBE SCHEMA {quoted('.'.join(parts[:-1]))}").collect()
            return bool(self.spark.catalog.tableExists(self.name))
        except Exception as exc:
            raise self._failed(exc, "read") from None

    def delta(self) -> Any | None:
        """``delta.tables.DeltaTable`` of the table, or None when it does not exist."""
        from delta.tables import DeltaTable

        if not self.exists():
            return None
        try:
            if self.name is not None:
                return DeltaTable.forName(self.spark, self.name)
            return DeltaTable.forPath(self.spark, self.location)
        except Exception as exc:
            raise self._failed(exc, "read") from None

    def frame(self) -> DataFrame:
        """The table's rows as they are now."""
        if self.name is not None:
            return self.spark.table(quoted(self.name))
        return self.spark.read.format("delta").load(self.location)

    def history(self, limit: int | None, handle: Any | None = None) -> list[dict[str, object]]:
        """commitInfo dicts (:data:`HISTORY_COLUMNS`, ``timestamp`` in epoch milliseconds as
        delta-rs gives it), newest first; [] when there is no table. ``handle``: the table's
        ``DeltaTable`` when the caller holds one (each ``history()`` reads the log anew)."""
        table = handle if handle is not None else self.delta()
        if table is None:
            return []
        frame = table.history(limit) if limit is not None else table.history()
        present = [c for c in HISTORY_COLUMNS if c in frame.columns]
        rows = [row.asDict(recursive=True) for row in frame.select(*present).collect()]
        for row in rows:
            stamp = row.get("timestamp")
            row["timestamp"] = int(stamp.timestamp() * 1000) if stamp is not None else None
        return rows

    def create_if_missing(
        self, schema: StructType, properties: Mapping[str, str] = NEW_TABLE_PROPERTIES
    ) -> None:
        """By name: create the table (``schema``, made nullable as a first append makes it;
        ``properties``) when it does not exist yet, as its first write needs; by path nothing
        (the first append creates it)."""
        if self.name is None:
            return
        from delta.tables import DeltaTable

        try:
            builder = DeltaTable.createIfNotExists(self.spark).tableName(self.name)
            builder = builder.addColumns(as_nullable(schema))
            for key, value in properties.items():
                builder = builder.property(key, value)
            builder.execute()
        except Exception as exc:
            raise self._failed(exc, "create") from None

    def save(self, writer: DataFrameWriter) -> None:
        """Run ``writer`` (format delta, mode and options set) against the table."""
        try:
            if self.name is not None:
                writer.saveAsTable(self.name)
            else:
                writer.save(self.location)
        except Exception as exc:
            raise self._failed(exc, "write") from None

    def sql_name(self) -> str:
        """The table in SQL: its quoted name, or ``delta.`<path>```."""
        if self.name is not None:
            return quoted(self.name)
        return "delta.`" + self.location.replace("`", "``") + "`"
