"""The engine a project depends on, for the template (a Jinja extension cookiecutter loads
through ``_extensions``): the version it pins (``engine_version``). Where pip finds the
wheels is ``engine_source``'s.

A module of its own, not part of ``local_extensions``: ``cruft update`` renders the project's
old template and the new one in one process, and Python keeps the first ``local_extensions``
it imported; a project generated before this module existed would render the new template with
the old module, which has none of this.
"""

from __future__ import annotations

import re
from pathlib import Path

from jinja2 import Environment
from jinja2.ext import Extension

# The engine's version, read from the template repository's engine/pyproject.toml (cruft and
# cookiecutter render from a checkout of the whole repository): what a project pins.
_ENGINE = Path(__file__).resolve().parent.parent / "engine"


def engine_version() -> str:
    text = (_ENGINE / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^version = "([^"]+)"$', text, re.M).group(1)  # the [project] table's


class EngineExtension(Extension):
    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.globals["engine_version"] = engine_version()
