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
ENGINE = "template/{{cookiecutter.project_slug}}/src/kafka_delta"
USER_PACKAGE = "template/{{cookiecutter.project_slug}}/src/{{cookiecutter.package_name}}"
PROJECT_CONF = "template/{{cookiecutter.project_slug}}/conf/local.yaml"
# The last template commit whose projects carried the engine inside their own package
# (src/<pkg>/offsets.py, ...): the migration test generates a project there.
BEFORE_THE_ENGINE_MOVED_OUT = "df09585a65b1e319cae85a162203486b03b8b7d6"

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
    offsets = repo / ENGINE / "offsets" / "model.py"
    offsets.write_text(offsets.read_text() + engine_fix)
    replace_once(
        repo / PROJECT_CONF,
        "  fail_on_data_loss: true\n",
        "  fail_on_data_loss: true\n  # template commit B: a new comment in the config\n",
    )
    template_transform = repo / USER_PACKAGE / "transform.py"
    template_transform.write_text(template_transform.read_text() + "\n# sample changed in B\n")
    git(repo, "commit", "-q", "-am", "commit B: fix the engine")
    commit_b = git(repo, "rev-parse", "HEAD")

    behind = cruft(project, home, "check")
    assert behind.returncode == 1, behind.stdout + behind.stderr

    # 4. cruft update brings the change.
    updated = cruft(project, home, "update", "-y")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    engine = project / "src" / "kafka_delta"
    assert (engine / "offsets" / "model.py").read_text() == offsets.read_text()
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
        "src/kafka_delta/offsets/model.py",
    ], changed
    leftovers = [p for p in project.rglob("*") if p.suffix in {".rej", ".orig"}]
    assert not leftovers and "<<<<<<<" not in config


def _has_commit(commit: str) -> bool:
    found = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    return found.returncode == 0


def test_a_project_generated_before_the_engine_moved_out_migrates_with_one_cruft_update(
    tmp_path: Path,
) -> None:
    """docs/migration.md, as a user follows it: a project generated when the engine lived in its
    own package takes the new layout (the engine as src/kafka_delta, the user's package small)
    with one ``cruft update``; the user's edits survive, the one edit the note asks for is made,
    and the project's suite passes."""
    if not _has_commit(BEFORE_THE_ENGINE_MOVED_OUT):
        pytest.skip(
            f"this clone lacks commit {BEFORE_THE_ENGINE_MOVED_OUT[:12]} (a shallow clone): the "
            "migration is tested from the template as it was there"
        )
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "template-repo"
    repo.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", BEFORE_THE_ENGINE_MOVED_OUT, "template"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the engine inside the project's package")
    old = git(repo, "rev-parse", "HEAD")

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
    assert (package / "offsets.py").is_file()  # the old layout: the engine in the package
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "generated")
    replace_once(
        project / "conf" / "local.yaml",
        "max_records_per_trigger: 500000",
        "max_records_per_trigger: 1234",
    )
    user_transform = (package / "transform.py").read_text() + "\n# our own change\n"
    (package / "transform.py").write_text(user_transform)
    git(project, "commit", "-q", "-am", "our batch size and transform")

    # The template moves on to today's layout.
    shutil.rmtree(repo / "template")
    shutil.copytree(
        ROOT / "template",
        repo / "template",
        ignore=shutil.ignore_patterns("__pycache__", ".ruff_cache", ".pytest_cache"),
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the engine as its own package")
    new = git(repo, "rev-parse", "HEAD")
    assert new != old

    updated = cruft(project, home, "update", "-y")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert json.loads((project / ".cruft.json").read_text())["commit"] == new
    leftovers = [p for p in project.rglob("*") if p.suffix in {".rej", ".orig"}]
    config = (project / "conf" / "local.yaml").read_text()
    assert not leftovers and "<<<<<<<" not in config, leftovers
    # The user's package holds the user's files only; the engine is src/kafka_delta.
    assert sorted(p.name for p in package.iterdir() if p.name != "__pycache__") == [
        "__init__.py",
        "__main__.py",
        "main.py",
        "transform.py",
    ]
    assert (project / "src" / "kafka_delta" / "pipeline.py").is_file()
    # The user's edits survive; the config gained the line naming the transform.
    assert "max_records_per_trigger: 1234" in config
    assert "transform: orders_stream.transform:transform" in config
    assert (package / "transform.py").read_text() == user_transform

    # docs/migration.md: the one edit of a file cruft leaves to the user.
    replace_once(
        project / "tests" / "test_transform.py",
        "from orders_stream.embedded.source import SCHEMA\n",
        "from kafka_delta import KAFKA_SCHEMA as SCHEMA\n",
    )
    env = {
        k: v for k, v in os.environ.items() if k not in {"KAFKA_BOOTSTRAP_SERVERS", "PYTHONPATH"}
    }
    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"],
        cwd=project,
        env={**env, "PYTHONPATH": str(project / "src")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert suite.returncode == 0, suite.stdout[-6000:] + suite.stderr[-2000:]
    assert " passed" in suite.stdout and "skipped" not in suite.stdout, suite.stdout[-2000:]
