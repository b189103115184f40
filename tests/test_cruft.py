"""Generated projects follow their template with cruft, proven on real git repositories in tmp:
render at one template commit, let the user edit and commit, commit a fix to the engine in the
template, and `cruft update` brings the fix while the user's edits survive."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "conf" / "embedded-local.yaml"
ENGINE = "template/{{cookiecutter.project_slug}}/src/{{cookiecutter.package_name}}"
PROJECT_CONF = "template/{{cookiecutter.project_slug}}/conf/local.yaml"

if shutil.which("git") is None:
    pytest.skip("cruft works on git repositories: git is not on PATH", allow_module_level=True)


def git(cwd: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def cruft(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # HOME in tmp: cookiecutter writes a replay file under ~ on every render.
    env = {**os.environ, "HOME": str(home), "GIT_AUTHOR_NAME": "test", "GIT_COMMITTER_NAME": "t"}
    env.update(GIT_AUTHOR_EMAIL="test@example.invalid", GIT_COMMITTER_EMAIL="t@example.invalid")
    return subprocess.run(
        [sys.executable, "-m", "cruft", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def template_repo(path: Path) -> str:
    """A git repository holding this checkout's template/ (as the published repo does);
    returns its first commit."""
    shutil.copytree(
        ROOT / "template",
        path / "template",
        ignore=shutil.ignore_patterns("__pycache__", ".ruff_cache", ".pytest_cache"),
    )
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "template at commit A")
    return git(path, "rev-parse", "HEAD")


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} in {path}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_cruft_update_brings_an_engine_fix_and_keeps_the_users_edits(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "template-repo"
    commit_a = template_repo(repo)

    # 1. Render at commit A, from the template's subfolder, with preset answers.
    created = cruft(
        tmp_path,
        home,
        "create",
        str(repo),
        "--directory",
        "template",
        "--output-dir",
        str(tmp_path / "projects"),
        "--config-file",
        str(PRESET),
        "--no-input",
    )
    assert created.returncode == 0, created.stdout + created.stderr
    project = tmp_path / "projects" / "orders-stream"
    package = project / "src" / "orders_stream"
    state = json.loads((project / ".cruft.json").read_text())
    assert (state["template"], state["commit"], state["directory"]) == (
        str(repo),
        commit_a,
        "template",
    )
    assert state["context"]["cookiecutter"]["package_name"] == "orders_stream"
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "generated")

    # 2. The user's own edits, committed.
    transform = package / "transform.py"
    user_transform = transform.read_text() + "\n\ndef my_enrichment() -> str:\n    return 'x'\n"
    transform.write_text(user_transform)
    replace_once(
        project / "conf" / "local.yaml",
        "max_records_per_trigger: 500000",
        "max_records_per_trigger: 1234",
    )
    git(project, "commit", "-q", "-am", "our transform and batch size")

    # 3. A fix to an engine file in the template (and changes elsewhere), committed there.
    engine_fix = "\n\n# Fix from the template (commit B).\nTEMPLATE_FIX_B = True\n"
    offsets = repo / ENGINE / "offsets.py"
    offsets.write_text(offsets.read_text() + engine_fix)
    replace_once(
        repo / PROJECT_CONF,
        "  fail_on_data_loss: true\n",
        "  fail_on_data_loss: true\n  # template commit B: a new comment in the config\n",
    )
    template_transform = repo / ENGINE / "transform.py"
    template_transform.write_text(template_transform.read_text() + "\n# sample changed in B\n")
    git(repo, "commit", "-q", "-am", "commit B: fix the engine")
    commit_b = git(repo, "rev-parse", "HEAD")

    behind = cruft(project, home, "check")
    assert behind.returncode == 1, behind.stdout + behind.stderr

    # 4. cruft update brings the change.
    updated = cruft(project, home, "update", "-y")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert (package / "offsets.py").read_text() == offsets.read_text()
    assert json.loads((project / ".cruft.json").read_text())["commit"] == commit_b
    assert cruft(project, home, "check").returncode == 0

    # 5. The user's edits survive: merged where the template changed the same file, untouched
    # where the project keeps the file its own ([tool.cruft] skip).
    config = (project / "conf" / "local.yaml").read_text()
    assert "max_records_per_trigger: 1234" in config
    assert "# template commit B: a new comment in the config" in config
    assert transform.read_text() == user_transform
    changed = git(project, "status", "--porcelain").splitlines()
    assert sorted(line.split()[-1] for line in changed) == [
        ".cruft.json",
        "conf/local.yaml",
        "src/orders_stream/offsets.py",
    ], changed
    leftovers = [p for p in project.rglob("*") if p.suffix in {".rej", ".orig"}]
    assert not leftovers and "<<<<<<<" not in config
