"""Checks the entry point runs before Spark starts, each failing with one sentence.

Without them the same mistakes surface late and unreadably: a bootstrap address nobody listens
on gave ~1,300 librdkafka lines over 44 s before the real message, a table path that is a
plain file gave delta-rs's "Path does not exist", and a table path that is a folder of other
files (an ``x.csv``) was silently adopted: the first run created a Delta table beside them.
"""

from __future__ import annotations

import socket
from pathlib import Path

from kafka_delta.config import PipelineConfig
from kafka_delta.delta.locations import local_path
from kafka_delta.kafka.admin import KafkaAdmin, KafkaRefusedError, KafkaUnavailableError
from kafka_delta.table_names import is_table_name

# Long enough for a broker across a slow network to answer a metadata request, short enough
# that an unreachable one is reported within 15 s of the start.
KAFKA_TIMEOUT_S = 10.0
# Per bootstrap address, for the plain TCP connection tried first.
CONNECT_TIMEOUT_S = 3.0


class PreflightError(RuntimeError):
    """The pipeline cannot start; the message says why in one sentence."""


def check(
    config: PipelineConfig, kafka_timeout_s: float = KAFKA_TIMEOUT_S, remote: str | None = None
) -> None:
    """Every check: the table, dead-letter table and checkpoint paths, the Spark Connect
    server ``remote`` names (``spark.remote``, or ``SPARK_REMOTE``), then Kafka."""
    check_paths(config)
    check_spark_connect(remote)
    check_kafka(config, kafka_timeout_s)


def check_spark_connect(remote: str | None) -> None:
    """A Spark Connect server named by ``sc://host:port`` accepts a TCP connection. Without
    this check its client retries for minutes before its first error (measured: over 10 min
    with pyspark 4.2's default policy). ``local[N]`` (pyspark starts the server itself) and
    no remote at all pass."""
    if not remote or not remote.startswith("sc://"):
        return
    authority = remote[len("sc://") :].split("/", 1)[0].split(";", 1)[0]
    host, _, port = authority.rpartition(":")
    address = authority if host and port.isdigit() else f"{authority}:15002"  # Connect's port
    failure = _connect(address)
    if failure is not None:
        raise PreflightError(
            f"cannot reach the Spark Connect server at {remote} ({failure}): start it, or "
            "point spark.remote (or SPARK_REMOTE) at a running one; nothing was read or written"
        )


def check_paths(config: PipelineConfig) -> None:
    """A local table, dead-letter table or checkpoint path must be a folder or creatable as one
    (remote URIs are left to their storage); a table's folder must not hold another's files."""
    paths: list[tuple[str, str, dict[str, str] | None]] = []
    for view in config.table_configs():  # each table of `tables:`, else the one table
        where = "" if view.table_name is None else f"tables.{view.table_name}."
        options = view.delta.storage_options
        key = f"{where}delta.table" if not where else f"{where}path"
        paths.append((key, view.delta.table, options))
        if view.dead_letter_table is not None:
            paths.append((f"{where}dead_letters.table", view.dead_letter_table, options))
    paths.append(("checkpoint", config.checkpoint, None))
    for key, location, options in paths:
        if is_table_name(location):  # a catalog table, no folder of this machine's
            continue
        path = local_path(location)
        if path is not None:
            _check_folder(key, location, path)
        if options is not None:  # a table, not the checkpoint
            _refuse_a_foreign_folder(key, location, options)


# What a table's folder may hold besides its log before its first commit: the engine's side
# folder and a crashed first batch's data files (Spark's and the delta-rs sink's writers both
# name them part-*.parquet; hidden .crc files, _-prefixed folders and key=value partition
# folders come with them). Anything else is somebody else's data.
def _ours(name: str) -> bool:
    return name.startswith((".", "_", "part-")) or "=" in name


def _refuse_a_foreign_folder(
    key: str, location: str, storage_options: dict[str, str] | None
) -> None:
    """A table location that is a folder holding other files but no Delta table (no
    ``_delta_log``) is refused: the first run would create a table beside them, adopting a
    folder that is not the pipeline's. An empty folder, a missing one and a Delta table pass.
    Local folders and S3 buckets are listed (with the table's storage options); a location
    that cannot be listed here is left to the storage (the sink finds it at its first write)."""
    names = _listing(location, storage_options)
    if not names or "_delta_log" in names:
        return
    foreign = sorted(n for n in names if not _ours(n))
    if foreign:
        shown = ", ".join(foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        raise PreflightError(
            f"{key} {location} is a folder that holds other files ({shown}) and no Delta table "
            f"(no _delta_log): point {key} at an empty or new folder, or at a Delta table; "
            "nothing was read or written"
        )


def _listing(location: str, storage_options: dict[str, str] | None) -> list[str]:
    """The names directly under ``location``; [] when it does not exist or cannot be listed."""
    path = local_path(location)
    if path is not None:
        return sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    if location.partition("://")[0].lower() not in ("s3", "s3a"):
        return []
    import pyarrow.fs as pafs

    from kafka_delta.delta.side_folder import open_side

    try:
        filesystem, root = open_side(location, storage_options)
        infos = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    except Exception:  # no credentials here, a network hiccup: the sink will tell
        return []
    return sorted(info.base_name for info in infos)


def _check_folder(key: str, location: str, path: Path) -> None:
    what = "a Delta table" if key != "checkpoint" else "a Spark checkpoint"
    if path.exists() and not path.is_dir():
        raise PreflightError(
            f"{key} {location} is a file, not a folder: {what} is a folder; point {key} at a "
            "folder (it is created if missing)"
        )
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise PreflightError(
                    f"{key} {location} cannot be created: {parent} is a file, not a folder"
                )
            return


def check_kafka(config: PipelineConfig, timeout_s: float = KAFKA_TIMEOUT_S) -> None:
    """Some bootstrap address accepts a TCP connection, the brokers answer a metadata request
    within ``timeout_s`` (refusing neither the client's login nor its TLS handshake), every
    topic exists, and the client may read it."""
    servers = config.kafka.bootstrap_servers
    failures = [f for f in (_connect(a) for a in servers.split(",") if a.strip()) if f]
    if failures and len(failures) == len([a for a in servers.split(",") if a.strip()]):
        # librdkafka would only say "Broker transport failure" after its timeout; the
        # operating system says why at once.
        raise PreflightError(
            f"cannot reach Kafka at {servers} ({'; '.join(failures)}): check "
            "kafka.bootstrap_servers (or --bootstrap-servers) and that the brokers are up"
        )
    try:
        admin = KafkaAdmin(config.kafka.client_config(), timeout_s=timeout_s)
        admin.partitions(config.kafka.topics)
        # A principal without Read on a topic stops here, with the ACL to grant, not in a
        # read task after Spark started.
        admin.readable(config.kafka.topics)
    except KafkaRefusedError as exc:  # the brokers answered: the settings are wrong
        raise PreflightError(f"{exc}; nothing was read or written") from None
    except KafkaUnavailableError as exc:
        raise PreflightError(
            f"{exc}: check kafka.bootstrap_servers (or --bootstrap-servers) and that the "
            "brokers are up"
        ) from None
    except ValueError as exc:  # a topic that does not exist
        raise PreflightError(str(exc)) from None


def _connect(address: str) -> str | None:
    """Why a TCP connection to ``host:port`` fails, or None when it succeeds."""
    host, _, port = address.strip().rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return f"{address.strip()}: {reason or type(exc).__name__}"
    return None
