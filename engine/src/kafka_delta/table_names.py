"""A table location is a path or a catalog name, never a guess between the two.

The rule, applied to ``delta.table``, ``dead_letters.table`` and every ``tables:`` entry:

- a value with a ``/`` in it, or a URI scheme (``s3://``, ``abfss://``, ``dbfs:/``,
  ``file:/``), or starting with ``.`` or ``~``, is a **path**;
- a value of two or three dot-separated identifiers (``schema.table``,
  ``catalog.schema.table``; a part is ``[A-Za-z_][A-Za-z0-9_]*`` or backticked,
  ``main.`my-schema`.orders``) is a **table name**, looked up in Spark's catalog (Unity
  Catalog on Databricks, the session catalog over a local Hive metastore elsewhere);
- anything else is refused, a bare word (``orders``) included: it could mean a folder in the
  project or a table in the default schema, and taking it for the wrong one writes somewhere
  the user did not mean (``default.kd_orders`` once became a folder of that name).

A folder whose name looks like a name is written as a path: ``./orders.v2``.
"""

from __future__ import annotations

import re

_PART = r"(?:[A-Za-z_][A-Za-z0-9_]*|`(?:[^`]|``)+`)"
# Two or three parts; the braces apart so that no Jinja marker appears in the template.
_NAME_RE = re.compile(rf"^{_PART}(?:\.{_PART})" + "{1,2}$")
_PART_RE = re.compile(_PART)
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def is_path(value: str) -> bool:
    """``value`` is a path (a ``/``, a scheme, or a leading ``.`` / ``~``)."""
    return "/" in value or "\\" in value or bool(_SCHEME_RE.match(value)) or value[:1] in ".~"


def is_table_name(value: str) -> bool:
    """``value`` is a table's name in a catalog (see the module docstring).

    >>> is_table_name("main.sales.orders"), is_table_name("default.kd_orders")
    (True, True)
    >>> is_table_name("data/orders"), is_table_name("orders"), is_table_name("s3://b/t")
    (False, False, False)
    """
    return not is_path(value) and bool(_NAME_RE.match(value))


def location_problem(value: str) -> str | None:
    """Why ``value`` is neither a path nor a table name (one sentence), or None when it is one."""
    if is_path(value) or is_table_name(value):
        return None
    return (
        f"{value!r} is neither a path nor a table name: write a folder as a path (./{value}) "
        f"or a table as schema.table or catalog.schema.table (default.{value})"
    )


def name_parts(name: str) -> list[str]:
    """The parts of a table name, unquoted: ``main.`my-s`.t`` -> ``['main', 'my-s', 't']``."""
    parts = [m.group(0) for m in _PART_RE.finditer(name)]
    return [p[1:-1].replace("``", "`") if p.startswith("`") else p for p in parts]


def quoted(name: str) -> str:
    """The name as Spark SQL takes it, every part backticked: ``main.`my-s`.t`` ->
    ```main`.`my-s`.`t```."""
    return ".".join(_quote(part) for part in name_parts(name))


def _quote(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def with_suffix(location: str, suffix: str) -> str:
    """A sibling table named by ``suffix`` (the default dead-letter table): a path gets it on
    its last folder, a name on its table part (``main.s.o`` -> ``main.s.o_dead_letters``)."""
    if not is_table_name(location):
        return f"{location.rstrip('/')}{suffix}"
    *head, last = name_parts(location)
    parts = [*head, last + suffix]
    return ".".join(p if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) else _quote(p) for p in parts)
