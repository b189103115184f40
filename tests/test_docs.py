"""The documentation holds together: every relative link of the repository's and the engine's
Markdown resolves, and the generated README, a guide whose reference lives in the engine's docs
(engine/docs/, which a project has no copy of), names each of those files once and no other."""

from __future__ import annotations

import re
from pathlib import Path

from cookiecutter.main import cookiecutter

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "conf" / "embedded-local.yaml"
ENGINE_DOCS = ROOT / "engine" / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def markdown_files() -> list[Path]:
    engine = ROOT / "engine"
    return sorted(
        [
            ROOT / "README.md",
            *(ROOT / "docs").glob("*.md"),
            engine / "README.md",
            engine / "CHANGELOG.md",
            *ENGINE_DOCS.glob("*.md"),
        ]
    )


def test_every_relative_link_of_the_docs_resolves() -> None:
    files = markdown_files()
    assert len(files) > 10, files
    broken = []
    for path in files:
        for target in LINK.findall(path.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_generated_readme_names_each_engine_doc_once(tmp_path: Path) -> None:
    project = Path(
        cookiecutter(
            str(ROOT / "template"), no_input=True, config_file=str(PRESET), output_dir=str(tmp_path)
        )
    )
    readme = (project / "README.md").read_text(encoding="utf-8")
    assert not (project / "docs").exists(), "the engine's docs are not copied into a project"
    assert "`engine/docs/`" in readme, "the README must say where the engine's docs are"
    docs = sorted(p.name for p in ENGINE_DOCS.glob("*.md"))
    named = re.findall(r"`([\w-]+\.md)`", readme)
    counts = {name: named.count(name) for name in docs}
    assert all(n == 1 for n in counts.values()), counts
    assert set(named) <= set(docs), sorted(set(named) - set(docs))
    # A guide, not the reference: the reference grows in engine/docs/. About 250 lines of
    # guide, plus the sections a way to run it brings (on a cluster: 20 lines, its detail in
    # operations.md).
    assert len(readme.splitlines()) <= 300, len(readme.splitlines())
