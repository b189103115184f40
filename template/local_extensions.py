"""Jinja filters for the template (loaded by cookiecutter through ``_extensions``)."""

from __future__ import annotations

import json
import re

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

