"""Every restart recovers (I9): the checkpoint is judged against the table before the query starts.

Spark resumes a checkpoint from its own offset log, whatever the table says. The table is the
truth (its commit holds the rows and the offsets atomically), so before the query starts, the
position the checkpoint would resume from is compared with the table's stored offsets:

- **equal** (or the checkpoint's pending batch is the table's newest commit, a replay): resume;
- **behind the table**: another run of the pipeline (a retried job, a second checkpoint, the
  winner of a race) moved the table on, or an operator reset it forward. Resuming would re-plan
  ranges the table holds and be fenced on every restart. The checkpoint is **set aside**
  (renamed, kept, named in the log) and the run resumes from the table: nothing is lost, since
  everything below the table's offsets is in it;
- **ahead of the table, after an operator's explicit move** (a Delta RESTORE, an ``offsets
  reset`` with rewind, committed after the checkpoint's last commit to the table: positions in
  the Delta log, never clocks): set aside as well; the run reads the records again from the
  offsets the operator chose;
- **ahead of the table after log cleanup removed the pipeline's commits**: the stored offsets
  are where the table's rows end (:func:`kafka_delta.offsets.stored.from_the_rows`), and the
  records past them either are not in the table (a RESTORE whose commit was cleaned up) or
  gave no row: set aside, and read again from the rows' end;
- **ahead of the table without one**: the table lost commits the checkpoint saw (a table
  replaced or rolled back outside Delta's RESTORE). Nothing explains which records to re-read,
  so the run stops with one sentence.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass

from kafka_delta.delta.locations import local_path
from kafka_delta.offsets.model import StoredOffsets, app_id
from kafka_delta.recovery.checkpoint import CheckpointLog, CheckpointMismatchError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """What to do with the checkpoint: ``resume``, ``set_aside`` or ``stop``, and why."""

    action: str
    reason: str = ""


def combined(verdicts: dict[str | None, Verdict]) -> Verdict:
    """One verdict on the checkpoint of a pipeline that writes several tables, from each
    table's: it stops when one table's says so, is set aside when one table's says so (the new
    checkpoint starts where the table furthest behind ends, and each table skips, per
    partition, what it holds), else resumes. One table: its verdict as it is."""
    for action in ("stop", "set_aside"):
        found = [(name, v) for name, v in verdicts.items() if v.action == action]
        if found:
            reasons = "; ".join(
                v.reason if name is None else f"table {name}: {v.reason}" for name, v in found
            )
            return Verdict(action, reasons)
    return Verdict("resume")


def judge(
    checkpoint: CheckpointLog,
    stored: StoredOffsets | None,
    pipeline_id: str,
    commit_version: Callable[[str], int | None],
    table: str | None = None,
) -> Verdict:
    """The verdict on a checkpoint that planned at least one batch, against ``stored``;
    ``commit_version(app_id)``: the Delta version of the table's newest commit made by a
    checkpoint (:func:`..offsets.stored.newest_commit_version`); ``table``: the table's name
    in ``tables:`` (its txnAppId names it), None for a pipeline of one table."""
    if stored is None or not checkpoint.has_plan():
        return Verdict("resume")
    planned, committed, position = checkpoint.resume_position()
    query_id = checkpoint.query_id()
    if (
        not committed
        and query_id is not None
        and stored.app_id == app_id(pipeline_id, query_id, table)
        and stored.batch_id is not None
        and stored.batch_id >= planned
    ):
        return Verdict("resume")  # the pending batch is in the table: Spark replays it
    ours = commit_version(app_id(pipeline_id, query_id, table)) if query_id is not None else None
    moved = _operator_move_after(stored, ours)
    if position is None:
        if committed or not any(stored.offsets.values()):
            return Verdict("resume")
        # Batch 0 was planned, never committed, and its start is not recorded (the embedded
        # source plans it from the table): a checkpoint without one committed batch holds
        # nothing the table needs, and resuming it could only be fenced if the table moved.
        return Verdict(
            "set_aside",
            f"its first batch was planned but never committed, and the table stores "
            f"{stored.describe()} (a retried job)",
        )
    shared = [
        (t, p, position[t][p], o)
        for t, parts in stored.offsets.items()
        for p, o in parts.items()
        if p in position.get(t, {})
    ]
    behind = [(t, p, c, o) for t, p, c, o in shared if c < o]
    ahead = [(t, p, c, o) for t, p, c, o in shared if c > o]
    # After an operator's move, partitions the table no longer stores (a RESTORE to before the
    # pipeline's first commit) are ahead of it too: the checkpoint read them.
    dropped = [
        (t, p, c, None)
        for t, parts in position.items()
        for p, c in parts.items()
        if moved is not None and p not in stored.offsets.get(t, {})
    ]
    ahead += dropped
    if not behind and not ahead:
        return Verdict("resume")
    detail = "; ".join(
        f"{t}[{p}] checkpoint {c}, table {'-' if o is None else o}"
        for t, p, c, o in (ahead + behind)[:4]
    ) + ("; ..." if len(ahead) + len(behind) > 4 else "")
    if moved is not None:
        reason = f"{moved} after this checkpoint's last commit ({detail})"
        return Verdict("set_aside", reason)
    if not ahead:
        return Verdict(
            "set_aside",
            f"another run of the pipeline moved the table on to {stored.describe()} ({detail})",
        )
    return Verdict(
        "stop",
        f"checkpoint {checkpoint.location} is ahead of table's stored offsets ({detail}; stored "
        f"at {stored.describe()}), and no RESTORE or offsets reset explains it: the table lost "
        "commits the checkpoint saw. Nothing was read or written. Restore the table with Delta's "
        "RESTORE or set its offsets with `offsets reset`, then start again.",
    )


def _operator_move_after(stored: StoredOffsets, ours: int | None) -> str | None:
    """How an operator moved the table's offsets (a reset, a RESTORE) after the checkpoint's
    last commit to the table, at Delta version ``ours`` (None: the retained log holds no commit
    of it, so any move it holds came after), or None.

    Judged by positions in the table's log, never by clocks: a RESTORE or reset made while a
    run was idle, and the batch the run planned after it (then fenced), leave a checkpoint
    ahead of the table that the move explains; the host that made the move and the driver may
    disagree on the time."""
    if stored.reset is not None and stored.delta_version is not None:
        if ours is None or stored.delta_version > ours:
            return f"the table's offsets were reset ({stored.describe()})"
    if stored.recomputed:
        # Nothing left in the log says what moved the table since the checkpoint: the offsets
        # are where its rows end (offsets.stored.from_the_rows), and reading on from there
        # takes again only records that gave no row (filtered, dead letters: written once).
        return (
            "log cleanup removed the pipeline's commits, and the table's rows end before this "
            "checkpoint (a RESTORE since, or the checkpoint's last records gave no row)"
        )
    if stored.restore is not None and (ours is None or stored.restore["version"] > ours):
        return (
            f"Delta version {stored.restore['version']} restored the table to version "
            f"{stored.restore['to']}"
        )
    return None


def set_aside(checkpoint: CheckpointLog, reason: str) -> str:
    """Rename the checkpoint to ``<location>.set-aside-<UTC time>`` (kept, never deleted; a
    ``-2``, ``-3``... suffix when a checkpoint was set aside there in the same second) and
    return the new location; the run then starts a new checkpoint at the table's offsets."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = f"{checkpoint.location}.set-aside-{stamp}"
    target = base
    local = local_path(checkpoint.location)
    try:
        exists = _exists_locally if local is not None else _remote_exists
        for n in range(2, 1000):
            if not exists(target):
                break
            target = f"{base}-{n}"
        if local is not None:
            local.rename(local_path(target))  # type: ignore[arg-type]
        else:
            _rename_remote(checkpoint.location, target)
    except Exception as exc:
        raise CheckpointMismatchError(
            f"checkpoint {checkpoint.location} must be set aside ({reason}), but renaming it "
            f"failed ({exc}). Nothing was read or written. Move it aside by hand (to {target}) "
            "and start again: the run resumes from the table."
        ) from None
    log.warning(
        "checkpoint %s set aside as %s: %s; this run resumes from the table",
        checkpoint.location,
        target,
        reason,
    )
    return target


def _exists_locally(location: str) -> bool:
    path = local_path(location)
    return path is not None and (path.exists() or path.is_symlink())


def _remote_exists(location: str) -> bool:
    """Whether a checkpoint URI (``s3://``, ``gs://``, ``abfs://`` ...) exists, through
    pyarrow's file system of that scheme: the driver's Python reaches it without Spark's JVM,
    as under Spark Connect it must."""
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(location)
    return filesystem.get_file_info(path).type != pafs.FileType.NotFound


def _rename_remote(source: str, target: str) -> None:
    """Object stores have no rename of a folder (Hadoop's S3A copies and deletes too): every
    file is copied, and the source deleted only once all are, so a failure midway leaves the
    checkpoint where it was (and a partial copy the message names)."""
    from pyarrow import fs as pafs

    filesystem, path = pafs.FileSystem.from_uri(source)
    _, to = pafs.FileSystem.from_uri(target)
    files = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
    for info in files:
        if info.type == pafs.FileType.File:
            filesystem.copy_file(info.path, to + info.path[len(path) :])
    filesystem.delete_dir(path)
