"""The run lease: how `offsets reset` (another process, maybe another machine) knows that a
run of the pipeline is active, instead of guessing.

While :meth:`..pipeline.Pipeline.run` runs it keeps a small JSON file in the pipeline's side
folder (:mod:`kafka_delta.delta.side_folder`), ``<side>/<pipeline_id>/runs/<run id>.json``
(host, pid, checkpoint, query id, start time, heartbeat), refreshes its heartbeat every
:data:`HEARTBEAT_SECONDS` from a daemon thread, and removes it on exit. One file per run, so two
runs (two checkpoints) never overwrite each other's lease.

Where the side folder is depends on the sink, and so does what a lease can tell:

- delta-rs sink: ``<table>/_kafka_delta/`` (Delta ignores folders starting with ``_`` inside a
  table: readers, VACUUM). Every run of the pipeline leaves its lease there, whatever its
  checkpoint: ``offsets reset`` sees them all.
- delta-spark sink: ``<checkpoint>.kafka_delta/`` (``runs/<table digest>/``: the tables of one
  pipeline share a checkpoint), beside the checkpoint, never in the table's folder (a Unity
  Catalog table has none the driver may write; I14). ``offsets reset`` sees the runs on its
  config's checkpoint; a run on another checkpoint is one it cannot see, and the
  Delta fence (below) is what keeps the reset and that run's commits apart, as it already was
  for a run on a host whose clock is off.

A lease is *active* when, on this host, its process is alive (the pid, checked against the
process start time so a reused pid does not count), and, from another host, when its heartbeat
is younger than :data:`STALE_AFTER_SECONDS`. A lease left by a killed process is therefore
stale at once on its own host and after :data:`STALE_AFTER_SECONDS` elsewhere.

"This host" means more than the hostname: a pid only names a process inside one PID namespace
of one boot. Containers with host networking share the host's hostname but not its PID
namespace, and a rebooted machine keeps its name but reuses pids. So a lease counts as written
here only when hostname, boot id (``/proc/sys/kernel/random/boot_id``) and PID namespace
(``/proc/self/ns/pid``) all match; where either id cannot be read, on either side (no
``/proc``), the heartbeat decides, as for another host.

The lease is also the checkpoint's: a run refuses to start, before it reads or writes
anything (the checkpoint's recovery included, which may rename it), while another active run
holds a lease on the same checkpoint (:class:`CheckpointInUseError`). Two runs that start at
the same moment both write their lease before either reads the others'; each then sees the
other, and the one whose lease is older by ``(started_ms, run_id)`` (values both read from
the same files, so both agree whatever the clocks say) goes on while the other stops.
``started_ms`` is taken once the lease file is visible, and later than every key it sees then,
so a run whose read missed another's lease holds the strictly older key (on one clock: across
hosts, clocks decide, and the Delta fence still stops a conflicting commit).

A lease wrongly judged active (its run is gone but its heartbeat is still fresh, or a clock is
off) never blocks an operator for good: the message names the lease file to delete, and
``offsets reset --no-run-check`` skips the check (the Delta fence still refuses a reset
that races a real commit).

The lease is advisory. What makes a reset safe even when a run was missed (a host whose clock
is off, a table location the lease cannot be written to) is the Delta fence: the reset is one
commit of the pipeline's fence txn made without retries, so it and a pipeline commit cannot
both land on the same stored offsets, and a running pipeline's next batch then stops with a
fencing error instead of ignoring the reset (see :mod:`kafka_delta.offsets.fencing`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from pyarrow import fs as pafs

from kafka_delta.config import PipelineConfig
from kafka_delta.delta import side_folder
from kafka_delta.delta.locations import local_path
from kafka_delta.offsets.model import TABLE_SIDE_FOLDER
from kafka_delta.runtime.processes import pid_exists

# Object stores reached through delta-rs take whole payloads: a small file is written through a
# buffered stream (an unbuffered write hands it a pyarrow Buffer, which it refuses).
WRITE_BUFFER_BYTES = 1 << 16

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
STALE_AFTER_SECONDS = 30.0


class LeaseUnavailableError(RuntimeError):
    """The lease folder of a table cannot be read or written (an unsupported location)."""


class CheckpointInUseError(RuntimeError):
    """Another active run of the pipeline holds the checkpoint this run would use."""


@dataclass(frozen=True)
class Lease:
    run_id: str
    pipeline_id: str
    host: str
    pid: int
    # The process's start time (Linux /proc/<pid>/stat, clock ticks since boot): tells a live
    # run from another process that reused its pid.
    pid_start: int | None
    checkpoint: str
    query_id: str | None
    started_ms: int
    heartbeat_ms: int
    # Where the pid means something: the kernel boot and the PID namespace of the writer (None
    # where /proc does not tell, and in leases written before these fields existed).
    boot_id: str | None = None
    pid_namespace: str | None = None
    # The file this lease was read from (not stored in it): what an operator deletes.
    path: str | None = field(default=None, compare=False)

    def to_json(self) -> str:
        record = asdict(self)
        del record["path"]
        return json.dumps(record)

    @classmethod
    def from_json(cls, text: str | bytes, path: str | None = None) -> Lease:
        record = json.loads(text)
        known = {f.name for f in fields(cls)} - {"path"}
        # A newer writer's extra fields are ignored rather than making the lease unreadable.
        return cls(**{k: v for k, v in record.items() if k in known}, path=path)

    def describe(self, now_ms: int | None = None) -> str:
        now_ms = now_ms if now_ms is not None else _now_ms()
        text = (
            f"pid {self.pid} on {self.host}, checkpoint {self.checkpoint}, query "
            f"{self.query_id or '(starting)'}, started {(now_ms - self.started_ms) / 1000:.0f}s "
            f"ago, heartbeat {(now_ms - self.heartbeat_ms) / 1000:.0f}s ago"
        )
        if self.path is not None:
            text += (
                f"; if you know that run is gone, delete its lease file {self.path} "
                "or pass --no-run-check"
            )
        return text


def _now_ms() -> int:
    return int(time.time() * 1000)


def _process_start(pid: int) -> int | None:
    """Start time of process ``pid`` (clock ticks after boot), None where /proc is absent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces, hence the last ')'); field 22.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _read_id(path: str, read: Callable[[str], str]) -> str | None:
    try:
        return read(path).strip() or None
    except OSError:  # no /proc (macOS, Windows), or not allowed to read it
        return None


@dataclass(frozen=True)
class HostIdentity:
    """What makes a pid comparable: same hostname, same boot, same PID namespace."""

    host: str
    boot_id: str | None
    pid_namespace: str | None

    @classmethod
    def here(cls) -> HostIdentity:
        return cls(
            host=socket.gethostname(),
            boot_id=_read_id("/proc/sys/kernel/random/boot_id", lambda p: Path(p).read_text()),
            pid_namespace=_read_id("/proc/self/ns/pid", os.readlink),
        )

    def wrote(self, lease: Lease) -> bool:
        """True when ``lease`` was written in this boot and PID namespace of this host, so its
        pid can be checked here. Unknown ids (either side) never count as a match."""
        return (
            lease.host == self.host
            and self.boot_id is not None
            and lease.boot_id == self.boot_id
            and self.pid_namespace is not None
            and lease.pid_namespace == self.pid_namespace
        )


def _pid_alive(pid: int, pid_start: int | None) -> bool:
    if not pid_exists(pid):
        return False
    if pid_start is None:
        return True
    now_start = _process_start(pid)
    return now_start is None or now_start == pid_start


def is_active(lease: Lease, now_ms: int | None = None, here: HostIdentity | None = None) -> bool:
    """True when the run holding ``lease`` is still running (see the module docstring)."""
    if (here or HostIdentity.here()).wrote(lease):
        return _pid_alive(lease.pid, lease.pid_start)
    now_ms = now_ms if now_ms is not None else _now_ms()
    return now_ms - lease.heartbeat_ms < STALE_AFTER_SECONDS * 1000


@dataclass(frozen=True)
class LeaseFolder:
    """Where one pipeline's leases are: the file system, the folder in it, how an operator
    names a file there, and the local folder the lease may remove again when empty (the one
    a run that wrote nothing must not leave behind), if any."""

    filesystem: pafs.FileSystem
    folder: str
    display: Callable[[str], str]
    prune_stop: Path | None = None


def _table_runs_folder(
    table_uri: str, pipeline_id: str, storage_options: dict[str, str] | None
) -> LeaseFolder:
    """The delta-rs sink's lease folder, reached with the table's storage options (an object
    store's endpoint, region and credentials are the commit's: see
    :mod:`kafka_delta.delta.table_storage`; the embedded engine only)."""
    from kafka_delta.delta.table_storage import display, join, open_filesystem

    try:
        filesystem, root = open_filesystem(table_uri, storage_options, create=False)
    except Exception as exc:
        raise LeaseUnavailableError(f"cannot keep a run lease at {table_uri}: {exc}") from None
    table = local_path(table_uri)
    # A run that writes nothing must not leave a table folder behind.
    stop = None if table is None else (table.parent if not table.exists() else table)
    return LeaseFolder(
        filesystem,
        join(root, TABLE_SIDE_FOLDER, pipeline_id, "runs"),
        lambda path: display(table_uri, path),
        stop,
    )


def lease_folder(config: PipelineConfig) -> LeaseFolder:
    """The lease folder of ``config``'s pipeline (see the module docstring)."""
    if config.engine.sink == "delta_rs":
        return _table_runs_folder(
            config.delta.table, config.pipeline_id, config.delta.storage_options
        )
    location = side_folder.side_location("delta_spark", config.delta.table, config.checkpoint)
    try:
        filesystem, root = side_folder.open_side(location, config.delta.storage_options)
    except Exception as exc:
        raise LeaseUnavailableError(f"cannot keep a run lease at {location}: {exc}") from None
    local = local_path(location)
    stop = None if local is None else (local.parent if not local.exists() else local)
    # One folder per table: the tables of a pipeline (tables:) share its checkpoint, and a run
    # holds a lease on each, as it does in each table's folder on the delta-rs sink.
    table = side_folder.table_key(config.delta.table)
    return LeaseFolder(
        filesystem,
        f"{root}/{config.pipeline_id}/runs/{table}",
        lambda path: side_folder.display(location, root, path),
        stop,
    )


def read_leases(
    table_uri: str, pipeline_id: str, storage_options: dict[str, str] | None = None
) -> list[Lease]:
    """Every lease file of ``pipeline_id`` under the table (delta-rs sink), active or not."""
    where = _table_runs_folder(table_uri, pipeline_id, storage_options)
    return read_leases_in(where.filesystem, where.folder, where.display)


def leases_of(config: PipelineConfig) -> list[Lease]:
    """Every lease file of ``config``'s pipeline in its lease folder, active or not."""
    where = lease_folder(config)
    return read_leases_in(where.filesystem, where.folder, where.display)


def same_checkpoint(a: str, b: str) -> bool:
    """Whether two checkpoint locations name one folder (a local path, resolved; else the
    URI as written, without a trailing slash)."""
    la, lb = local_path(a), local_path(b)
    if la is not None and lb is not None:
        return la.resolve() == lb.resolve()
    return a.rstrip("/") == b.rstrip("/")


def read_leases_in(
    filesystem: pafs.FileSystem, folder: str, display: Callable[[str], str]
) -> list[Lease]:
    """Every lease file in ``folder``; ``display`` names a file as an operator types it."""
    try:
        infos = filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except OSError as exc:
        raise LeaseUnavailableError(f"cannot read run leases in {folder}: {exc}") from None
    leases = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue
        try:
            with filesystem.open_input_stream(info.path) as stream:
                leases.append(Lease.from_json(stream.read(), path=display(info.path)))
        except FileNotFoundError:
            continue  # released while we listed
        except (OSError, TypeError, ValueError) as exc:
            raise LeaseUnavailableError(f"unreadable run lease {info.path}: {exc}") from None
    return leases


def active_leases(
    table_uri: str, pipeline_id: str, storage_options: dict[str, str] | None = None
) -> list[Lease]:
    here = HostIdentity.here()
    leases = read_leases(table_uri, pipeline_id, storage_options)
    return [lease for lease in leases if is_active(lease, here=here)]


def active_leases_of(config: PipelineConfig) -> list[Lease]:
    """The active leases in ``config``'s lease folder (see the module docstring)."""
    here = HostIdentity.here()
    return [lease for lease in leases_of(config) if is_active(lease, here=here)]


class RunLease:
    """The lease of one run; use :meth:`hold`."""

    def __init__(
        self, config: PipelineConfig, query_id: Callable[[], str | None] = lambda: None
    ) -> None:
        where = lease_folder(config)
        self._fs, self._folder, self._display = where.filesystem, where.folder, where.display
        # A run that writes nothing (bad config, a bad record) must not leave a table (or side)
        # folder behind: on release, the folders the lease created are removed again when empty.
        self._prune_stop = where.prune_stop
        pid = os.getpid()
        now = _now_ms()
        here = HostIdentity.here()
        self.lease = Lease(
            run_id=f"{here.host}-{pid}-{uuid.uuid4().hex[:8]}",
            pipeline_id=config.pipeline_id,
            host=here.host,
            pid=pid,
            pid_start=_process_start(pid),
            checkpoint=config.checkpoint,
            query_id=None,
            started_ms=now,
            heartbeat_ms=now,
            boot_id=here.boot_id,
            pid_namespace=here.pid_namespace,
        )
        self._query_id = query_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def path(self) -> str:
        return f"{self._folder}/{self.lease.run_id}.json"

    def _write(self) -> None:
        with self._lock:
            self.lease = replace(self.lease, query_id=self._query_id(), heartbeat_ms=_now_ms())
            self._fs.create_dir(self._folder, recursive=True)  # a released run may prune it
            temporary = f"{self._folder}/.{self.lease.run_id}.tmp"
            with self._fs.open_output_stream(temporary, buffer_size=WRITE_BUFFER_BYTES) as stream:
                stream.write(self.lease.to_json().encode())
            self._fs.move(temporary, self.path)  # readers never see half a file

    def acquire(self) -> RunLease:
        self._write()
        # The order key is taken once the lease can be seen, and written before the others'
        # are read: a run that read the leases without seeing this one then holds an older
        # key. Taken before the write, a run slow to write (a thread that lost the GIL) could
        # hold the older key yet be unseen by a run that already went on: both went on.
        # And strictly later than every key on this checkpoint it can see now: a run that went
        # on wrote its key before it read, so this run sees it; within one tick of the clock
        # the two keys were equal and the random run ids decided (both went on, half the time).
        with self._lock:
            seen = read_leases_in(self._fs, self._folder, self._display)
        keys = [
            lease.started_ms
            for lease in seen
            if lease.run_id != self.lease.run_id
            and same_checkpoint(lease.checkpoint, self.lease.checkpoint)
        ]
        self.lease = replace(self.lease, started_ms=max([_now_ms(), *(k + 1 for k in keys)]))
        self._write()
        self._thread = threading.Thread(target=self._beat, name="run-lease", daemon=True)
        self._thread.start()
        log.debug("run lease %s", self.path)
        return self

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._write()
            except Exception as exc:  # the lease is advisory: never fail the run for it
                log.warning("cannot refresh the run lease %s: %s", self.path, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_SECONDS)
        with self._lock:
            try:
                self._fs.delete_file(self.path)
            except (FileNotFoundError, OSError) as exc:
                log.warning("cannot remove the run lease %s: %s", self.path, exc)
            self._prune()

    def _prune(self) -> None:
        """Remove the lease's folders, and the table (or side) folder it created, while they are
        empty (a local folder; object stores have no folders to leave behind)."""
        if self._prune_stop is None:
            return
        folders = [Path(self._folder), *Path(self._folder).parents]
        stop = self._prune_stop
        for folder in folders:
            if folder == stop:
                break
            try:
                folder.rmdir()  # only when empty: another run's lease stays
            except OSError:
                break

    def first_on_checkpoint(self) -> None:
        """Raise :class:`CheckpointInUseError` when another active run holds a lease on this
        run's checkpoint and came first (see the module docstring); call after
        :meth:`acquire`, before anything else."""
        mine = self.lease
        here = HostIdentity.here()
        with self._lock:
            leases = read_leases_in(self._fs, self._folder, self._display)
        rivals = [
            lease
            for lease in leases
            if lease.run_id != mine.run_id
            and same_checkpoint(lease.checkpoint, mine.checkpoint)
            and is_active(lease, here=here)
            and (lease.started_ms, lease.run_id) < (mine.started_ms, mine.run_id)
        ]
        if rivals:
            other = rivals[0]
            now = _now_ms()
            raise CheckpointInUseError(
                f"checkpoint {mine.checkpoint} is in use by another run of pipeline "
                f"{mine.pipeline_id} (pid {other.pid} on {other.host}, started "
                f"{(now - other.started_ms) / 1000:.0f}s ago, heartbeat "
                f"{(now - other.heartbeat_ms) / 1000:.0f}s ago): one checkpoint takes one run. "
                "Nothing was read or written. Let that run finish or stop it, or give this run "
                "a checkpoint of its own; if you know that run is gone, delete its lease file "
                f"{other.path} and start again."
            )

    @classmethod
    @contextmanager
    def hold(
        cls, config: PipelineConfig, query_id: Callable[[], str | None] = lambda: None
    ) -> Iterator[RunLease | None]:
        """Hold a lease for the block; when it cannot be written, warn and run without one
        (the Delta fence still protects the table)."""
        try:
            lease: RunLease | None = cls(config, query_id).acquire()
        except (LeaseUnavailableError, OSError) as exc:
            log.warning(
                "no run lease (offsets reset cannot see this run; the Delta fence still "
                "stops a conflicting commit): %s",
                exc,
            )
            lease = None
        try:
            if lease is not None:
                lease.first_on_checkpoint()
            yield lease
        finally:
            if lease is not None:
                lease.release()
