"""The engine a project depends on, for the template (a Jinja extension cookiecutter loads
through ``_extensions``): the version it pins (``engine_version``) and where pip finds the
wheels (``engine_wheels``).

A module of its own, not part of ``local_extensions``: ``cruft update`` renders the project's
old template and the new one in one process, and Python keeps the first ``local_extensions``
it imported; a project generated before this module existed would render the new template with
the old module, which has none of this.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from jinja2 import Environment
from jinja2.ext import Extension

# The engine's version, read from the template repository's engine/pyproject.toml (cruft and
# cookiecutter render from a checkout of the whole repository): what a project pins.
_ENGINE = Path(__file__).resolve().parent.parent / "engine"


def engine_version() -> str:
    text = (_ENGINE / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^version = "([^"]+)"$', text, re.M).group(1)  # the [project] table's


_GITHUB = re.compile(r"^(?:https://|git@)github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


def engine_wheels(context: Mapping[str, object]) -> str:
    """Where pip finds the engine's wheels for a project rendered with this cookiecutter
    ``context``: a local checkout's ``dist/`` (its ``scripts/engine-wheels`` builds them there),
    a GitHub repository's release of this version, or "" where neither is known (the project's
    engine.txt then says what to write).

    ``_template`` is what the user named: cruft makes a local one absolute (and renders from a
    clone of it, so this module's own folder is not the user's checkout); plain cookiecutter
    keeps it as typed, maybe relative, and renders from the checkout itself, so a relative one
    is this module's own repository (cookiecutter changes the working folder while rendering)."""
    text = str(context.get("_template", ""))
    match = _GITHUB.match(text)
    if match:
        owner, repo = match.groups()
        return f"https://github.com/{owner}/{repo}/releases/expanded_assets/v{engine_version()}"
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text or text.startswith(("git@", "gh:", "gl:", "bb:")):
        return ""
    root = Path(text).expanduser()
    if not root.is_absolute():
        return str(_ENGINE.parent / "dist")
    if (root / "cookiecutter.json").is_file():  # the template folder itself: its repository
        root = root.parent
    return str(root.resolve() / "dist")


class EngineExtension(Extension):
    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.globals["engine_version"] = engine_version()
        environment.filters["engine_wheels"] = engine_wheels
