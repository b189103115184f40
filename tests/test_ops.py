"""The operations harness, CI-sized: random sequences of operator moves (scripts/ops.py, drawn
from fixed seeds) against its model of what Kafka holds, on the delta-rs sink (delta-spark's
where its jars are: KAFKA_DELTA_JARS), for a pipeline of one table and one of two. Nothing lost,
nothing doubled, no stuck state, and `offsets verify --against-kafka` agrees with the model
after every catch-up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from skips import DELTA, missing_connectors

REPO = Path(__file__).resolve().parents[1]
LAST_LINE = re.compile(
    r"^ops-random: sink=(\w+) tables=(\d) sequences=(\d+) moves=(\d+) lost=(\d+) "
    r"doubled=(\d+) stuck=(\d+) verify_disagreements=(\d+)$"
)
# The fewest moves whose sequences, together, make every move of the harness (searched over
# seeds 1-300 at 6 to 10 moves a sequence: no two seeds do, three of 7 moves do, 21 moves in
# all against 32 for the four seeds of 8 before): RESTOREs, log cleanup, a reset each way,
# topics added, removed and recreated, a race, crashes, maintenance, a committed transaction,
# a lost checkpoint.
SEEDS = [5, 177, 241]
# Two tables (--tables 2): two seeds of 7 moves that make, between them, the moves that act on
# one table of several or on how they line up (searched over seeds 1-400): a table deleted,
# RESTOREs of either table, log cleanup, a reset each way, a race, crashes, a continuous run,
# a lost checkpoint.
SEEDS_OF_TWO = [1, 383]
OF_TWO = {"delete_table", "restore", "skip", "rewind", "clean_log", "crash", "race", "start"}
SEQUENCE = re.compile(r"^\[ops [\d:]+\] sequence \d+/\d+ \(seed \d+\): (.*)$", re.MULTILINE)
MOVES = 7


def _run_ops(tmp_path: Path, sink: str, tables: int, seeds: list[int]) -> tuple[str, set[str]]:
    """scripts/ops.py on ``seeds``: asserts nothing lost, doubled or stuck and ``offsets
    verify`` agreeing; (the moves it offered, comma-separated; the moves its sequences made)."""
    argv = [sys.executable, str(REPO / "scripts" / "ops.py"), "--sink", sink]
    result = subprocess.run(
        [
            *argv,
            *("--tables", str(tables)),
            *("--seeds", ",".join(map(str, seeds)), "--moves", str(MOVES)),
            *("--workdir", str(tmp_path / "ops")),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    match = LAST_LINE.match(last)
    assert match, output[-8000:]
    name, of_tables, sequences, moves, lost, doubled, stuck, disagreements = match.groups()
    assert (name, int(of_tables), int(sequences)) == (sink, tables, len(seeds))
    assert (lost, doubled, stuck, disagreements) == ("0", "0", "0", "0"), output[-8000:]
    assert int(moves) >= len(seeds) * (MOVES + 3), last
    assert result.returncode == 0, output[-8000:]
    (offered,) = re.findall(r"; moves: (.*)$", result.stdout, re.MULTILINE)
    made = set(re.findall(r"\b([a-z_]+)(?:\(|\s|$)", " ".join(SEQUENCE.findall(result.stdout))))
    return offered, made


@pytest.mark.parametrize("sink", ["delta_rs", "delta_spark"])
def test_random_operator_moves_leave_every_record_exactly_once(tmp_path: Path, sink: str) -> None:
    if sink == "delta_spark" and DELTA in missing_connectors(os.environ):
        pytest.skip(f"{DELTA} jars not on the classpath")
    offered, made = _run_ops(tmp_path, sink, 1, SEEDS)
    # The seeds make every move (Tansu refuses CreatePartitions: add_partitions is a no-op here).
    assert set(offered.split(", ")) - {"add_partitions"} <= made, made


@pytest.mark.parametrize("sink", ["delta_rs", "delta_spark"])
def test_random_operator_moves_on_two_tables_leave_each_record_exactly_once_in_each(
    tmp_path: Path, sink: str
) -> None:
    if sink == "delta_spark" and DELTA in missing_connectors(os.environ):
        pytest.skip(f"{DELTA} jars not on the classpath")
    offered, made = _run_ops(tmp_path, sink, 2, SEEDS_OF_TWO)
    assert "delete_table" in offered.split(", "), offered
    assert made >= OF_TWO, made
