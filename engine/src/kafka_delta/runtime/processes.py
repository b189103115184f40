"""Local processes by pid: the one liveness probe the run lease, the class archive and the
embedded broker's state share."""

from __future__ import annotations

import os


def pid_exists(pid: int) -> bool:
    """A process ``pid`` exists on this machine (it may belong to another user). Says nothing
    of which program it runs: a pid can be reused once its process is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True
