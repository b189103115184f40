"""Where a project finds the engine's wheels, for the template (a Jinja extension cookiecutter
loads through ``_extensions``): ``engine_find_links``, what the project's ``engine.txt`` names,
and ``engine_dist``, the folder the post-generation hook copies the pinned wheels from.

A module of its own (not part of ``engine_extension``), for the reason that one gives: ``cruft
update`` renders a project's old template and the new one in one process, and Python keeps the
module the old template imported first; new names must live in a module the old one lacked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from jinja2 import Environment
from jinja2.ext import Extension

# The template repository (cruft and cookiecutter render from a checkout of the whole of it).
_REPO = Path(__file__).resolve().parent.parent
_GITHUB = re.compile(r"^(?:https://|git@)github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


def _engine_version() -> str:
    text = (_REPO / "engine" / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^version = "([^"]+)"$', text, re.M).group(1)  # the [project] table's


def engine_find_links(context: Mapping[str, object]) -> str:
    """What ``engine.txt`` sends pip to, a place that holds on any machine: a GitHub template's
    release of the pinned version (its page of assets), or else ``wheels``, the project's own
    folder (pip takes it relative to engine.txt), which the post-generation hook fills from a
    local checkout. Never a path of the machine that rendered the project."""
    match = _GITHUB.match(str(context.get("_template", "")))
    if match:
        owner, repo = match.groups()
        return f"https://github.com/{owner}/{repo}/releases/expanded_assets/v{_engine_version()}"
    return "wheels"


def engine_dist(context: Mapping[str, object]) -> str:
    """The ``dist/`` of the local template checkout a project is rendered from (its
    ``scripts/engine-wheels`` builds the engine's wheels there), or "" for a remote template.

    ``_template`` is what the user named: cruft makes a local one absolute (and renders from a
    clone of it, so this module's own folder is not the user's checkout, and the clone has no
    dist/); plain cookiecutter keeps it as typed, maybe relative, and renders from the checkout
    itself, so a relative one is this module's own repository (cookiecutter changes the working
    folder while rendering)."""
    text = str(context.get("_template", ""))
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text or text.startswith(("git@", "gh:", "gl:", "bb:")):
        return ""
    root = Path(text).expanduser()
    if not root.is_absolute():
        return str(_REPO / "dist")
    if (root / "cookiecutter.json").is_file():  # the template folder itself: its repository
        root = root.parent
    return str(root.resolve() / "dist")


class EngineSourceExtension(Extension):
    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.filters["engine_find_links"] = engine_find_links
        environment.filters["engine_dist"] = engine_dist
