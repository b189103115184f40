"""Runs the template's own devtools (embedded broker, sample producer) straight from
template/, without generating a project first: the engine under src/ is plain Python."""

from __future__ import annotations

import importlib
import os
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
    """Make template/'s package importable as :data:`ALIAS`, in this process and in the ones it
    starts (the broker's Schema Registry runs as ``python -m <ALIAS>.devtools.registry``): a
    folder in this interpreter's prefix holds a link named ALIAS to the package, and goes first
    on ``sys.path`` and on PYTHONPATH."""
    home = Path(sys.prefix) / "kafka-delta-template"
    link = home / ALIAS
    if not (link.is_symlink() and link.resolve() == PACKAGE_DIR.resolve()):
        home.mkdir(parents=True, exist_ok=True)
        partial = home / f".{ALIAS}.{os.getpid()}"
        partial.symlink_to(PACKAGE_DIR, target_is_directory=True)
        os.replace(partial, link)
    sys.path.insert(0, str(home))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(home), os.environ.get("PYTHONPATH")) if p
    )
    importlib.import_module(ALIAS)
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
