"""Runs the template's own devtools (embedded broker, sample producer) straight from
template/, without generating a project first: the engine under src/ is plain Python."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

PACKAGE_DIR = (
    Path(__file__).resolve().parents[1]
    / "template"
    / "{{cookiecutter.project_slug}}"
    / "src"
    / "{{cookiecutter.package_name}}"
)
ALIAS = "kafka_delta_template"


def load_template_package() -> str:
    spec = importlib.util.spec_from_file_location(
        ALIAS, PACKAGE_DIR / "__init__.py", submodule_search_locations=[str(PACKAGE_DIR)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[ALIAS] = module
    spec.loader.exec_module(module)
    return ALIAS


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"broker", "produce"}:
        print("usage: devtools.py {broker|produce} [args...]", file=sys.stderr)
        return 2
    package = load_template_package()
    tool = importlib.import_module(f"{package}.devtools.{argv[0]}")
    return int(tool._cli(argv[1:]))


if __name__ == "__main__":
    from process_exit import run_and_exit  # leaves with the real status, see there

    run_and_exit(lambda: main(sys.argv[1:]))
