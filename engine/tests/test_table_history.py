"""``table_history.live_history``: the Delta history in effect, a RESTORE hiding what it undid."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from kafka_delta.offsets.history import (
    RestoreUnreadableError,
    live_history,
    restores_in,
)


def _write(version: int) -> dict[str, object]:
    return {"version": version, "operation": "WRITE", "operationParameters": {"mode": "Append"}}


def _restore(at: int, **params: object) -> dict[str, object]:
    """The RESTORE committed as version ``at``, with these operationParameters."""
    return {"version": at, "operation": "RESTORE", "operationParameters": params}


def _versions(entries) -> list[int]:
    return [int(e["version"]) for e in entries]


def test_a_history_without_restore_is_all_in_effect() -> None:
    history = [_write(v) for v in (3, 2, 1, 0)]
    assert live_history(history) == history
    assert live_history([]) == []


def test_a_restore_hides_the_commits_above_its_target_and_is_left_out_itself() -> None:
    history = [_write(5), _restore(4, version="1"), _write(3), _write(2), _write(1), _write(0)]
    assert _versions(live_history(history)) == [5, 1, 0]
    assert restores_in(history) == [(4, 1)]


def test_delta_spark_parameters_with_a_null_timestamp_name_the_version() -> None:
    history = [{**_restore(3, version="1", timestamp=None), "operation": "restore"}, _write(2)]
    assert _versions(live_history([*history, _write(1), _write(0)])) == [1, 0]


def test_restores_in_sequence_each_hide_their_own_commits() -> None:
    # v3 restores to 1 (undoes 2), v6 restores to 4 (undoes 5): v4 and v1 are in effect.
    history = [
        _write(7),
        _restore(6, version="4"),
        _write(5),
        _write(4),
        _restore(3, version="1"),
        _write(2),
        _write(1),
        _write(0),
    ]
    assert _versions(live_history(history)) == [7, 4, 1, 0]
    assert restores_in(history) == [(6, 4), (3, 1)]


def test_a_restore_to_a_version_a_later_restore_undid_brings_that_version_back() -> None:
    # v2 restores to 0 (undoes 1); v4 restores to 1: version 1's data is the table again, and
    # the restore at v2 and the write at v3 are undone.
    history = [_restore(4, version="1"), _write(3), _restore(2, version="0"), _write(1), _write(0)]
    assert _versions(live_history(history)) == [1, 0]
    assert restores_in(history) == [(4, 1)]


def test_a_restore_by_time_only_is_refused_naming_its_version() -> None:
    # Even where commitInfo timestamps seem to tell the version (1), they are not what the
    # engine resolved the time by (commit file times): a guess one too new loses rows.
    stamp = int(datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC).timestamp() * 1000)
    history = [
        _restore(3, timestamp="2026-01-01 00:00:00"),
        {**_write(2), "timestamp": stamp + 500},
        {**_write(1), "timestamp": stamp - 500},
        {**_write(0), "timestamp": stamp - 900},
    ]
    with pytest.raises(RestoreUnreadableError, match=r"Delta version 3 is a RESTORE") as caught:
        live_history(history)
    assert isinstance(caught.value, ValueError)
    assert "cannot tell which of its commits the restore undid" in str(caught.value)


def test_a_restore_by_time_that_a_later_restore_undid_does_not_matter() -> None:
    history = [_restore(4, version="1"), _restore(3, timestamp="x"), _write(2), _write(1)]
    assert _versions(live_history(history)) == [1]


def test_delta_rs_restores_as_written_by_the_library(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for i in range(3):
        write_deltalake(uri, pa.table({"x": [i]}), mode="append")
    DeltaTable(uri).restore(1)
    write_deltalake(uri, pa.table({"x": [9]}), mode="append")
    assert _versions(live_history(DeltaTable(uri).history())) == [4, 1, 0]

    # Restored by time, delta-rs records only the time: refused.
    time.sleep(0.01)
    table = DeltaTable(uri)
    when = datetime.datetime.fromtimestamp(
        int(table.history(1)[0]["timestamp"]) / 1000, datetime.UTC
    )
    write_deltalake(uri, pa.table({"x": [10]}), mode="append")
    DeltaTable(uri).restore(when)
    with pytest.raises(RestoreUnreadableError, match=r"Delta version 6 is a RESTORE that names "):
        live_history(DeltaTable(uri).history())
