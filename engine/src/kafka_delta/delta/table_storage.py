"""The table's folder as a file system, reached the way the commit reaches it.

The delta-rs sink's parts that write or read files beside the Delta log (the data files the read
tasks write, the run leases under ``_kafka_delta/``) open the folder here,
with the table's ``delta.storage_options``: the same URI schemes (s3://, abfss://, gs://, ...)
and the same keys (endpoint, region, credentials, ``allow_http``) as delta-rs's commit, so a
table delta-rs can commit to is a folder every side file can be kept in. A local table goes
through pyarrow's own local file system; anything else through delta-rs's object store wrapped
as a pyarrow file system (``deltalake.fs.DeltaStorageHandler``), whose paths are relative to the
table's root.
"""

from __future__ import annotations

import pyarrow.fs as pafs

from kafka_delta.delta.locations import local_path

# delta-rs's object store takes whole payloads: a small file written through its pyarrow wrapper
# needs a buffered stream (an unbuffered write hands it a pyarrow Buffer, which it refuses).
WRITE_BUFFER_BYTES = 1 << 16


def is_local(table_uri: str) -> bool:
    return local_path(table_uri) is not None


def open_filesystem(
    table_uri: str,
    storage_options: dict[str, str] | None,
    via_delta_rs: bool = False,
    create: bool = True,
) -> tuple[pafs.FileSystem, str]:
    """(file system, the table's root in it). ``via_delta_rs`` forces the object-store route for
    a local table (tests); ``create`` makes a local table's folder when it is missing."""
    local_folder = local_path(table_uri)
    if local_folder is not None and not via_delta_rs:
        path = str(local_folder)
        local = pafs.LocalFileSystem()
        if create:
            local.create_dir(path, recursive=True)
        return local, path
    from deltalake.fs import DeltaStorageHandler

    if local_folder is not None:
        pafs.LocalFileSystem().create_dir(table_uri, recursive=True)
    handler = DeltaStorageHandler(table_uri, dict(storage_options or {}) or None)
    return pafs.PyFileSystem(handler), ""


def join(root: str, *parts: str) -> str:
    """A path under the table's root as :func:`open_filesystem` returned it."""
    return "/".join([root.rstrip("/"), *parts] if root else list(parts))


def display(table_uri: str, path: str) -> str:
    """What an operator would type to name ``path`` (from :func:`open_filesystem`'s file
    system): the path itself for a local table, else the table's URI joined with it."""
    return path if is_local(table_uri) else f"{table_uri.rstrip('/')}/{path}"
