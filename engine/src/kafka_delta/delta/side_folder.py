"""Where a pipeline keeps what is not Delta's: run leases (:mod:`kafka_delta.recovery.lease`)
and the delta-spark sink's commit copies (:mod:`kafka_delta.delta.commit_copies`).

- **delta-rs sink** (the embedded engine): ``<table>/_kafka_delta/<pipeline_id>/``, as before.
  That engine reaches the table's storage itself (it writes the data files), so the folder
  beside the log is one it can always write, and every run of the pipeline, whatever its
  checkpoint, keeps its lease in one place.
- **delta-spark sink** (the cluster engine): ``<checkpoint>.kafka_delta/<pipeline_id>/``, beside
  the checkpoint. The table's folder is Spark's alone there: a Unity Catalog managed table has
  no path the driver may write, and Python holds no credentials for it (I14). The checkpoint's
  location is one the job writes anyway (on Databricks a Unity Catalog volume, ``/Volumes/...``,
  which the driver reaches as files). *Beside* the checkpoint rather than inside it: a
  checkpoint the pipeline sets aside is renamed whole (:mod:`kafka_delta.recovery.verdict`), and
  an operator may delete one; neither may take the leases of a live run or the commit copies
  with it.

The folder is reached through pyarrow, never delta-rs (the cluster path imports no
``deltalake``): a local path, ``file:``, ``/Volumes/...``, ``/dbfs/...``, ``dbfs:/Volumes/...``
and ``dbfs:/...`` (through ``/dbfs/``, DBFS's mount on the driver) as local files;
``s3://``/``s3a://`` through pyarrow's S3 file system with the endpoint, region and
credentials of ``delta.storage_options`` (delta-rs's key names); any other scheme (``gs://``,
``abfss://``, ``hdfs://``) as pyarrow's ``FileSystem.from_uri`` opens it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import pyarrow.fs as pafs

from kafka_delta.delta.locations import local_path
from kafka_delta.offsets.model import TABLE_SIDE_FOLDER

# What follows the checkpoint's own name for the folder beside it (delta-spark sink).
CHECKPOINT_SIDE_SUFFIX = ".kafka_delta"


def table_key(table: str) -> str:
    """The folder name of one table's side files beside a checkpoint (the tables of a pipeline
    share its checkpoint): a digest of the table's location as configured, name or path."""
    return hashlib.sha256(table.rstrip("/").encode()).hexdigest()[:16]


def side_location(sink: str, table: str, checkpoint: str) -> str:
    """The location of the side folder of a pipeline's table (see the module docstring)."""
    if sink == "delta_rs":
        return f"{table.rstrip('/')}/{TABLE_SIDE_FOLDER}"
    return f"{checkpoint.rstrip('/')}{CHECKPOINT_SIDE_SUFFIX}"


def _s3(options: Mapping[str, str]) -> pafs.S3FileSystem:
    o = {k.lower(): v for k, v in options.items()}
    endpoint = o.get("aws_endpoint_url") or o.get("endpoint_url") or o.get("aws_endpoint")
    kwargs: dict[str, object] = {}
    if endpoint:
        scheme, _, rest = endpoint.partition("://")
        kwargs["endpoint_override"] = rest or scheme
        kwargs["scheme"] = scheme if rest else "https"
    if o.get("aws_access_key_id"):
        kwargs["access_key"] = o["aws_access_key_id"]
        kwargs["secret_key"] = o.get("aws_secret_access_key", "")
        if o.get("aws_session_token"):
            kwargs["session_token"] = o["aws_session_token"]
    if o.get("aws_region") or o.get("region"):
        kwargs["region"] = o.get("aws_region") or o.get("region")
    return pafs.S3FileSystem(**kwargs)  # type: ignore[arg-type]


def open_side(
    location: str, storage_options: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """(file system, the folder's path in it) for ``location``."""
    if location.startswith("dbfs:/Volumes/"):
        location = location.removeprefix("dbfs:")
    elif location.startswith("dbfs:/"):
        location = "/dbfs/" + location.removeprefix("dbfs:/")  # DBFS's FUSE mount
    local = local_path(location)
    if local is not None:
        return pafs.LocalFileSystem(), str(local)
    scheme, _, rest = location.partition("://")
    if scheme.lower() in ("s3", "s3a", "s3n"):
        return _s3(storage_options or {}), rest.rstrip("/")
    filesystem, path = pafs.FileSystem.from_uri(location)
    return filesystem, path.rstrip("/")


def display(location: str, root: str, path: str) -> str:
    """What an operator types to name ``path`` (under ``root``, the folder ``location`` names)."""
    if local_path(location) is not None:
        return path
    return f"{location.rstrip('/')}{path[len(root) :]}"
