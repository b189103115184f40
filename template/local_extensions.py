"""Jinja filters for the template (loaded by cookiecutter through ``_extensions``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from collections.abc import Mapping

from jinja2 import Environment
from jinja2.ext import Extension

# JSON string escapes are valid in both TOML basic strings and YAML double-quoted scalars,
# except that both reject surrogate escapes (what ensure_ascii makes of emoji) and YAML folds
# some control/separator characters. Keep real characters; escape only those.
_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff]")


def quoted(value: object) -> str:
    """A double-quoted string literal that TOML and YAML both parse back to ``value``."""
    text = json.dumps(str(value), ensure_ascii=False)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class QuotedExtension(Extension):
    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.filters["quoted"] = quoted


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
    engine.txt then says what to write). ``_template`` is what the user named (cruft: the
    repository; cookiecutter: the template folder, maybe relative), ``_repo_dir`` the folder
    cookiecutter read (absolute; a clone for a URL)."""
    template = str(context.get("_template", ""))
    local = "://" not in template and not template.startswith(("git@", "gh:", "gl:", "bb:"))
    text = str(context.get("_repo_dir") or template) if local else template
    match = _GITHUB.match(text)
    if match:
        owner, repo = match.groups()
        return f"https://github.com/{owner}/{repo}/releases/expanded_assets/v{engine_version()}"
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text or text.startswith(("git@", "gh:", "gl:", "bb:")):
        return ""
    root = Path(text).expanduser().resolve()
    if (root / "cookiecutter.json").is_file():  # the template folder itself: its repository
        root = root.parent
    return str(root / "dist")


class EngineExtension(Extension):
    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.globals["engine_version"] = engine_version()
        environment.filters["engine_wheels"] = engine_wheels
