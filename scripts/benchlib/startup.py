"""Start-up, split into phases read from the log lines a pipeline worker prints.

A worker logs in the engine's format (kafka_delta.cli:
``2026-01-02 10:11:12,345 INFO name: message``).
Each phase ends at the first line that announces it; a phase the log does not announce is left
out, and its time counts in the next one found:

- ``spark session``: process start (interpreter, imports, JVM) until the session is ready;
- ``stream set-up``: engine, stored offsets, checkpoint, until the streaming query started;
- ``first batch``: until the first batch's progress line (it is logged once committed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime

LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ (\S+): (.*)$")
# (phase, how a message announcing its end begins): the bench worker's own lines, and the
# wordings a pipeline may log itself. Anchored at the message's start, so that e.g. "stop
# requested before the query started" or "replayed batch 0: ..." announce nothing.
PHASES = (
    ("spark session", re.compile(r"^spark session (is )?(ready|started|created)\b", re.I)),
    ("stream set-up", re.compile(r"^(the )?(stream|streaming query|query)\b.*\bstarted\b", re.I)),
    # The pipeline's progress line, logged once a batch is committed: batch=<id> <key>=...
    ("first batch", re.compile(r"^batch=\d+ \w+=")),
)


def column(phase: str) -> str:
    """The CSV column of a phase: ``stream set-up`` -> ``startup_stream_set_up_s``."""
    return "startup_" + phase.replace(" ", "_").replace("-", "_") + "_s"


def log_time(stamp: str) -> float:
    """Epoch seconds of a log line's time (logging's asctime: local time, milliseconds)."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def phase_times(lines: Iterable[str]) -> dict[str, float]:
    """Epoch time at which each phase ended: the first log line announcing it."""
    ends: dict[str, float] = {}
    for line in lines:
        match = LINE.match(line)
        if match is None:
            continue
        for phase, pattern in PHASES:
            if phase not in ends and pattern.search(match.group(3)):
                ends[phase] = log_time(match.group(1))
    return ends


def phases(lines: Iterable[str], process_start: float) -> dict[str, float]:
    """Seconds each phase took, in order, from the process start; phases missing from the log
    are left out (their time goes to the next phase found)."""
    ends = phase_times(lines)
    out: dict[str, float] = {}
    previous = process_start
    for phase, _ in PHASES:
        if phase in ends and ends[phase] >= previous:
            out[phase] = round(ends[phase] - previous, 3)
            previous = ends[phase]
    return out
