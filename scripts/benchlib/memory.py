"""Memory readings from /proc: the process tree's summed RSS (sampled), and one process's own
RSS and peak RSS (``VmRSS`` / ``VmHWM``), which is what "driver RSS" means in this benchmark.

psutil is not a dependency here; /proc gives the same numbers (Linux only, as is the bench).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
MB = 2**20


# -- one process ----------------------------------------------------------------------------


def status_mb(pid: int | str, field: str) -> float | None:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident, the "high water mark") of one
    process in MB, from /proc/<pid>/status; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024 / MB
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak(pid: int | str) -> bool:
    """Reset the process's VmHWM to its current RSS (``echo 5 > /proc/<pid>/clear_refs``,
    Linux >= 4.0), so one process can measure the peak of each phase in turn. False when the
    kernel or the permissions refuse (then the peak covers the whole process life)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def find_jvm(root: int) -> int | None:
    """The Spark driver JVM under ``root`` (the Python driver): pyspark starts it through
    spark-submit, whose shell scripts exec ``java``; of several java descendants (the launcher's
    short-lived one), the largest."""
    javas = [p for p in tree_pids(root) if p != root and _comm(p) == "java"]
    return max(javas, key=_rss_bytes, default=None)


@dataclass(frozen=True)
class Drift:
    """How RSS moved over a run's batches: first and last per-batch sample (MB)."""

    first_mb: float
    last_mb: float
    batches: int

    @property
    def growth_mb(self) -> float:
        return self.last_mb - self.first_mb

    @property
    def growth_pct(self) -> float:
        return self.growth_mb / self.first_mb * 100 if self.first_mb else float("nan")


def drift(samples: Sequence[float | None]) -> Drift | None:
    """First vs last of the per-batch RSS samples (missing samples skipped); None with fewer
    than two. The first batch is where a run's working set is built; a flat run keeps it."""
    values = [s for s in samples if s is not None]
    if len(values) < 2:
        return None
    return Drift(values[0], values[-1], len(values))


def peak_ratio(peaks: dict[int, float | None]) -> float:
    """Peak RSS with the largest batch size over that with the smallest (``driver_rss_ratio``);
    nan unless both were measured."""
    sizes = sorted(s for s, v in peaks.items() if v)
    if len(sizes) < 2:
        return float("nan")
    return peaks[sizes[-1]] / peaks[sizes[0]]  # type: ignore[operator]


# -- the process tree -----------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses.
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(name))
    return tree


def tree_pids(root: int) -> list[int]:
    tree, pids, stack = _children(), [root], [root]
    while stack:
        for child in tree.get(stack.pop(), []):
            pids.append(child)
            stack.append(child)
    return pids


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


class TreeSampler(threading.Thread):
    """Samples the summed RSS of a process and all its descendants (the "peak RSS" column).

    Cheap on purpose (the machine under test has 2 cores): RSS from statm every
    ``interval_s``, the process tree rescanned every ``rescan_s``; PSS (smaps_rollup) would
    cost ~100 ms a sample for a Spark tree. A sampled peak can miss a spike shorter than the
    interval, and RSS counts pages shared between forked Python workers once per worker."""

    def __init__(self, pid: int, interval_s: float = 0.25, rescan_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.rescan_s = rescan_s
        self.samples: list[tuple[float, int]] = []  # (time, rss bytes)
        self._stop_event = threading.Event()
        # One sample before the thread exists: on a loaded machine the thread may first run
        # after a short worker has already exited (a tiny bench's row 1 reported 0 MB so).
        rss = _rss_bytes(pid)
        if rss:
            self.samples.append((time.time(), rss))

    def run(self) -> None:
        pids: list[int] = []
        rescan_at = 0.0
        while not self._stop_event.is_set():
            if time.monotonic() >= rescan_at:
                pids = tree_pids(self.pid)
                rescan_at = time.monotonic() + self.rescan_s
            rss = sum(_rss_bytes(p) for p in pids)
            if rss:
                self.samples.append((time.time(), rss))
            self._stop_event.wait(self.interval_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    @property
    def peak_rss_mb(self) -> float:
        return max((s[1] for s in self.samples), default=0) / MB

    def rss_mb_at(self, when: float) -> float | None:
        """RSS of the first sample at or after ``when`` (None when the run ended first)."""
        for t, rss in self.samples:
            if t >= when:
                return rss / MB
        return None
