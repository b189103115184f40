"""One Delta table as the cluster engine reaches it: through Spark alone (I14), by catalog name
(``main.sales.orders``: Unity Catalog on Databricks, the session catalog over a Hive metastore
locally) or by path (:mod:`kafka_delta.table_names` tells which).

Every read and write of the delta-spark sink, its offset store and the commands on a delta-spark
table goes through :class:`SparkTable`, in Spark SQL and the DataFrame API only: ``DESCRIBE
HISTORY``, ``SHOW TBLPROPERTIES``, ``MERGE INTO``, ``CREATE TABLE IF NOT EXISTS``,
``OPTIMIZE``, the rows as ``spark.table(name)`` / ``spark.read.format("delta").load(path)``, the
writer's ``saveAsTable(name)`` / ``save(path)``. Never delta-spark's Python ``DeltaTable``: under
Spark Connect it needs Delta's Connect plugin on the server (``delta.connect.DeltaRelation``),
which a plain Spark Connect server with Delta's jars lacks, while Delta's SQL runs on any session
with Delta's extension (classic, Connect, serverless, standard access). Nothing here opens a
file, imports delta-rs or touches Spark's JVM, so it runs where Python talks to Spark through
Spark Connect and where the platform gives storage credentials to Spark alone.

A table by name that does not exist yet is created before its first write with ``CREATE TABLE
IF NOT EXISTS`` (the batch's columns and the sink's table properties): a managed table in the
schema the name gives. By path, the first append creates it, as before.

Bad input is one sentence (:class:`TableAccessError`, exit code 2 from the command line), found
from Spark's own error classes and messages (:func:`access_problem`), never a trace: a catalog
or schema that does not exist, a path that is a catalog-managed table (use its name), a grant
the principal lacks.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

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


# Spark's and delta-spark's refusals of a table's creation by name that another writer made first:
# the catalog's (the name is taken); Delta's when the other's log is already in the managed
# location and its catalog entry not yet (``DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION``), or when
# both committed the log's first version at once (``DELTA_PROTOCOL_CHANGED``, "multiple writers are
# writing to an empty directory"; ``DELTA_METADATA_CHANGED``).
CREATED_BY_ANOTHER = (
    "ALREADY_EXISTS",
    "AlreadyExists",
    "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION",
    "DELTA_PROTOCOL_CHANGED",
    "ProtocolChangedException",
    "DELTA_METADATA_CHANGED",
    "MetadataChangedException",
)
# How long a table another run is creating by name is waited for to appear in the catalog.
CREATED_WAIT_S = 10.0


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


# Spark's answers for a path that holds no Delta table (DESCRIBE HISTORY of it): it does not
# exist yet, for the sink (the first append creates it).
_NOT_A_TABLE = (
    "DELTA_TABLE_ONLY_OPERATION",
    "DELTA_MISSING_DELTA_TABLE",
    "DELTA_TABLE_NOT_FOUND",
    "is not a Delta table",
    "PATH_NOT_FOUND",
)


def type_ddl(data_type: DataType) -> str:
    """``data_type`` in Spark SQL's DDL, every field name quoted (``simpleString`` quotes none)."""
    if isinstance(data_type, StructType):
        fields = ", ".join(f"{quoted_part(f.name)}: {type_ddl(f.dataType)}" for f in data_type)
        return f"STRUCT<{fields}>"
    if isinstance(data_type, ArrayType):
        return f"ARRAY<{type_ddl(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"MAP<{type_ddl(data_type.keyType)}, {type_ddl(data_type.valueType)}>"
    return data_type.simpleString()


def quoted_part(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def sql_literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class SparkTable:
    """One Delta table, by name or by path, reached through Spark SQL (see the module
    docstring)."""

    def __init__(self, spark: SparkSession, location: str) -> None:
        self.spark = spark
        self.location = location
        self.name = location if is_table_name(location) else None

    def _failed(self, exc: Exception, action: str) -> Exception:
        return access_problem(exc, self.location, action) or exc

    def exists(self) -> bool:
        """Whether the table exists. By name, its catalog and schema must exist (a
        :class:`TableAccessError` when they do not: a missing table is created, a missing
        schema is the config's mistake). By path, whether the path holds a Delta table (the
        analysis of a read of it: no Spark job)."""
        if self.name is None:
            return self.schema() is not None
        try:
            parts = name_parts(self.name)
            self.spark.sql(f"DESCRIBE SCHEMA {quoted('.'.join(parts[:-1]))}").collect()
            return bool(self.spark.catalog.tableExists(self.name))
        except Exception as exc:
            raise self._failed(exc, "read") from None

    def schema(self) -> StructType | None:
        """The table's columns, or None when it does not exist: ONE analysis of a read of the
        table (no Spark job), which is also how its existence is told. Why one: every analysis
        of a Delta table brings its snapshot up to date, which lists the table's log folder (on
        a local or Hadoop file system the whole folder, so it costs more as the log grows), and
        the sink reads the schema every batch; only a read that fails asks the catalog (by
        name: whether the schema or the table is what is missing)."""
        try:
            return self.frame().schema
        except Exception as exc:
            text = str(exc)
            if self.name is None and any(mark in text for mark in _NOT_A_TABLE):
                return None
            if self.name is None or "TABLE_OR_VIEW_NOT_FOUND" not in text:
                raise self._failed(exc, "read") from None
        # By name and not found: the catalog tells a missing schema or catalog (its sentence)
        # from a missing table (None); a table created since the read is read again.
        if not self.exists():
            return None
        try:
            return self.frame().schema
        except Exception as exc:
            raise self._failed(exc, "read") from None

    def frame(self) -> DataFrame:
        """The table's rows as they are now."""
        if self.name is not None:
            return self.spark.table(quoted(self.name))
        return self.spark.read.format("delta").load(self.location)

    def history(self, limit: int | None) -> list[dict[str, object]]:
        """commitInfo dicts (:data:`HISTORY_COLUMNS`, ``timestamp`` in epoch milliseconds as
        delta-rs gives it), newest first, from ``DESCRIBE HISTORY``; [] when there is no table.
        Each call is a Spark job of its own (delta-spark's history manager reads the newest
        ``limit`` commit files in one, ``spark.range(...).mapPartitions``) and brings the
        table's snapshot up to date twice (two listings of its log folder), so the sink reads
        one page per step and keeps it (:class:`.spark_offset_store.DeltaSparkLog`)."""
        query = f"DESCRIBE HISTORY {self.sql_name()}" + (
            f" LIMIT {int(limit)}" if limit is not None else ""
        )
        try:
            # collect() of the command's own result: a select() on it would be a second job.
            found = [row.asDict(recursive=True) for row in self.spark.sql(query).collect()]
            rows = [{c: row[c] for c in HISTORY_COLUMNS if c in row} for row in found]
        except Exception as exc:
            if self.name is None and any(mark in str(exc) for mark in _NOT_A_TABLE):
                return []
            if self.name is not None and "TABLE_OR_VIEW_NOT_FOUND" in str(exc):
                return []
            raise self._failed(exc, "read") from None
        for row in rows:
            stamp = row.get("timestamp")
            row["timestamp"] = int(stamp.timestamp() * 1000) if stamp is not None else None
        return rows

    def newest_version_is(self, version: int) -> bool:
        """Whether ``version`` is the table's newest Delta version, as Delta itself tells it:
        a time-travel read one version past it (``VERSION AS OF version + 1``) must fail with
        ``DELTA_VERSION_NOT_FOUND`` naming ``version`` as the latest. The read's analysis
        brings the table's snapshot up to date (a listing of its log, as :meth:`schema` does),
        runs no Spark job and reads no commit file; a commit file that the log has not
        backfilled yet (catalog-managed commits) counts, as it does for every reader of the
        table. Anything else (a newer version, no table, another error) is False: the caller
        reads the history instead."""
        query = f"SELECT * FROM {self.sql_name()} VERSION AS OF {int(version) + 1}"
        try:
            self.spark.sql(query).columns  # noqa: B018 (the analysis is the probe)
        except Exception as exc:
            condition = getattr(exc, "getCondition", lambda: None)()
            parameters = getattr(exc, "getMessageParameters", lambda: None)() or {}
            return condition == "DELTA_VERSION_NOT_FOUND" and parameters.get("latest") == str(
                version
            )
        return False

    def properties(self) -> dict[str, str]:
        """The table's properties (``SHOW TBLPROPERTIES``: its metadata, no Spark job)."""
        try:
            rows = self.spark.sql(f"SHOW TBLPROPERTIES {self.sql_name()}").collect()
        except Exception as exc:
            raise self._failed(exc, "read") from None
        return {str(r["key"]): str(r["value"]) for r in rows}

    def create_if_missing(
        self, schema: StructType, properties: Mapping[str, str] = NEW_TABLE_PROPERTIES
    ) -> None:
        """By name: create the table (``schema``, made nullable as a first append makes it;
        ``properties``) when it does not exist yet, as its first write needs; by path nothing
        (the first append creates it).

        Two runs creating it at once both go on to their appends, which the pipeline's fence
        orders like any two (one commits, the other is fenced): the second's statement finds
        the first's table in the catalog (IF NOT EXISTS, or the catalog's refusal), or finds the
        first's Delta log and not yet its catalog entry (:data:`CREATED_BY_ANOTHER`), and then
        waits, briefly, for that entry. Neither is a failure of this run's: before, the second
        ended in Delta's raw error (``DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION``), a stuck
        state, or was fenced with a sentence naming no commit (three and nine of twelve
        creations by two threads at once). A location with a Delta log that no table of the
        catalog comes to name is not a race: Spark's error is raised."""
        if self.name is None:
            return
        columns = ", ".join(
            f"{quoted_part(f.name)} {type_ddl(f.dataType)}" for f in as_nullable(schema).fields
        )
        props = ", ".join(f"{sql_literal(k)} = {sql_literal(v)}" for k, v in properties.items())
        statement = f"CREATE TABLE IF NOT EXISTS {self.sql_name()} ({columns}) USING delta" + (
            f" TBLPROPERTIES ({props})" if props else ""
        )
        try:
            self.spark.sql(statement).collect()
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if not any(mark in text for mark in CREATED_BY_ANOTHER) or not self._appears():
                raise self._failed(exc, "create") from None
            log.info(
                "table %s was created by a concurrent run (%s): appending to it",
                self.name,
                text.splitlines()[0][:200],
            )

    def _appears(self, wait_s: float = CREATED_WAIT_S) -> bool:
        """Whether the table by name is in the catalog, or comes to be within ``wait_s`` (a
        concurrent creation registers it right after writing its log)."""
        assert self.name is not None
        deadline = time.monotonic() + wait_s
        while not self.spark.catalog.tableExists(self.name):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
        return True

    def merge(self, frame: DataFrame, statement: Callable[[str], str]) -> None:
        """MERGE ``frame`` into the table: ``statement(view)`` is the ``MERGE INTO`` SQL of
        this table from the temporary view ``view`` of ``frame``, run in ``frame``'s own
        session (the batch's: the txn confs are set there) and dropped after."""
        session = frame.sparkSession
        view = f"kafka_delta_merge_{uuid.uuid4().hex}"
        frame.createOrReplaceTempView(view)
        try:
            session.sql(statement(view)).collect()
        except Exception as exc:
            raise self._failed(exc, "write") from None
        finally:
            session.catalog.dropTempView(view)

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
