"""The template repo's suite: every skip must be one this machine really has (tests/skips.py)."""

from __future__ import annotations

import os

import pytest
from skips import is_allowed


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    vacuous = [
        (report.nodeid, report.longrepr[2])
        for report in skipped
        if isinstance(report.longrepr, tuple) and not is_allowed(report.longrepr[2], os.environ)
    ]
    if vacuous:
        for nodeid, reason in vacuous:
            reporter.write_line(f"skipped on a machine that can run it: {nodeid}: {reason}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
