"""A Delta table's history as it is in effect: what a ``RESTORE`` undid is not part of it.

``RESTORE TABLE ... TO VERSION AS OF V`` (delta-spark) and ``DeltaTable.restore(V)`` (delta-rs)
commit a new version whose data is that of version V. The commits between V and the restore
stay in the log, with their ``userMetadata``, and neither engine reverts ``txn`` actions. A
reader that takes the newest commit record in the log as the table's state would therefore see
offsets whose rows the restore removed: the pipeline would resume after them, and lose them.

The rule: walking the history newest first, a RESTORE to V hides every entry whose version lies
above V (and below the restore). Restores can nest (a restore to a version that itself was
restored over), which the walk handles by lowering its ceiling as it goes. Both engines write
``operationParameters`` with ``version`` (a string). Restored by time, delta-spark writes only
``timestamp`` and delta-rs only ``datetime``. Such a restore is refused rather than resolved
here: the engines pick the version by the commit files' times (or in-commit timestamps), which
the ``timestamp`` of ``commitInfo`` need not equal, and a guess one version too new would resume
after rows the restore removed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping


class RestoreUnreadableError(ValueError):
    """A RESTORE commit does not say which version it restored to."""


def is_restore(entry: Mapping[str, object]) -> bool:
    """``entry`` (a commitInfo dict) is a RESTORE, by either engine."""
    return str(entry.get("operation", "")).upper() == "RESTORE"


def restored_to(entry: Mapping[str, object]) -> int | None:
    """The version a RESTORE entry restored the table to; None when ``entry`` is no RESTORE.
    Raises :class:`RestoreUnreadableError` for a RESTORE that names no version."""
    if not is_restore(entry):
        return None
    params = entry.get("operationParameters")
    params = params if isinstance(params, Mapping) else {}
    version = params.get("version")
    if version not in (None, "", "null"):
        try:
            return int(str(version))
        except ValueError:
            pass
    # delta-spark writes "timestamp", delta-rs "datetime" (epoch ms) for a restore by time.
    stamp = next(
        (params[k] for k in ("timestamp", "datetime") if params.get(k) not in (None, "", "null")),
        None,
    )
    given = f"only the time {stamp}" if stamp is not None else "no version"
    raise RestoreUnreadableError(
        f"Delta version {entry.get('version')} is a RESTORE that names {given}: the pipeline "
        "cannot tell which of its commits the restore undid. Restore by version (RESTORE TABLE "
        "... TO VERSION AS OF V), or set the offsets explicitly with `offsets reset`."
    )


def live_history(history: Iterable[Mapping[str, object]]) -> list[Mapping[str, object]]:
    """The entries of ``history`` (Delta commitInfo dicts, newest first, as delta-rs's
    ``DeltaTable.history()`` and delta-spark's ``DESCRIBE HISTORY`` give them) that are in
    effect, newest first: a RESTORE to version V hides the entries above V that precede it;
    the RESTORE entries themselves are left out. Raises :class:`RestoreUnreadableError` for a
    RESTORE whose target cannot be read.

    >>> live_history([{"version": 3, "operation": "RESTORE",
    ...                "operationParameters": {"version": "1"}},
    ...               {"version": 2}, {"version": 1}, {"version": 0}])
    [{'version': 1}, {'version': 0}]
    """
    return list(iter_live(history))


def _in_effect(
    history: Iterable[Mapping[str, object]],
) -> Iterator[tuple[Mapping[str, object], int | None]]:
    """The walk both readers share: each entry in effect, newest first, with the version it
    restored the table to (None for an entry that is no RESTORE)."""
    ceiling: int | None = None
    for entry in history:
        version = int(entry["version"])  # type: ignore[call-overload]
        if ceiling is not None and version > ceiling:
            continue
        target = restored_to(entry)
        if target is not None:
            ceiling = target if ceiling is None else min(ceiling, target)
        yield entry, target


def iter_live(history: Iterable[Mapping[str, object]]) -> Iterator[Mapping[str, object]]:
    """:func:`live_history`, lazily: a reader that stops at the first entry it wants (the
    pipeline's newest commit in effect) never judges the RESTOREs older than it, so an
    unreadable old restore does not block a table whose offsets were set after it."""
    return (entry for entry, target in _in_effect(history) if target is None)


def restores_in(history: Iterable[Mapping[str, object]]) -> list[tuple[int, int]]:
    """``(restore version, restored-to version)`` of every RESTORE in effect in ``history``
    (newest first), for messages and audits."""
    return [
        (int(entry["version"]), target)  # type: ignore[call-overload]
        for entry, target in _in_effect(history)
        if target is not None
    ]
