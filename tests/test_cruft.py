"""Generated projects follow their template with cruft, proven on real git repositories in tmp:
render at one template commit, let the user edit and commit, commit a change to the template
(a new engine version, a config comment), and `cruft update` brings it while the user's edits
survive; a project that carried a copy of the engine moves to the engine as a dependency with one
update and one install (engine/docs/migration.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "conf" / "embedded-local.yaml"
ENGINE_PYPROJECT = "engine/pyproject.toml"
USER_PACKAGE = "template/{{cookiecutter.project_slug}}/src/{{cookiecutter.package_name}}"
PROJECT_CONF = "template/{{cookiecutter.project_slug}}/conf/local.yaml"
# The last release whose projects carried a copy of the engine (src/kafka_delta,
# src/kafka_delta_dev, engine 0.2.0): the migration test generates a project there.
LAST_RELEASE_WITH_A_COPY = "5df3c29c7f60625448edb883e66dc3d7ee7dcf28"

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


def copy_template_and_engine(path: Path) -> None:
    """This checkout's template/ and engine/ (what a render reads: the template, and the engine's
    version it pins) and the engine's wheels in dist/, as scripts/engine-wheels builds them."""
    ignore = shutil.ignore_patterns("__pycache__", ".ruff_cache", ".pytest_cache")
    for part in ("template", "engine"):
        shutil.copytree(ROOT / part, path / part, ignore=ignore)
    (path / ".gitignore").write_text("/dist/\n")
    (path / "scripts").mkdir(exist_ok=True)
    shutil.copy2(ROOT / "scripts" / "engine-wheels", path / "scripts" / "engine-wheels")
    build_wheels(path)


def build_wheels(path: Path) -> None:
    """The engine's wheels of the repository at ``path``, into its dist/ (a release builds them)."""
    built = subprocess.run(
        [str(path / "scripts" / "engine-wheels")],
        env={**os.environ, "KD_VENV": str(Path(sys.executable).parents[1])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr


def template_repo(path: Path) -> str:
    """A git repository holding this checkout's template/ and engine/ (as the published repo
    does); returns its first commit."""
    copy_template_and_engine(path)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "template at commit A")
    return git(path, "rev-parse", "HEAD")


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} in {path}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_cruft_update_brings_a_new_engine_version_and_keeps_the_users_edits(tmp_path: Path) -> None:
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

    pinned = tomllib.loads((project / "pyproject.toml").read_text())["project"]["dependencies"]
    version = tomllib.loads((repo / ENGINE_PYPROJECT).read_text())["project"]["version"]
    assert pinned == [f"kafka-delta=={version}"], pinned

    # 3. A new engine release (the version the projects pin) and a change elsewhere, committed.
    release = version + ".post1"
    replace_once(repo / ENGINE_PYPROJECT, f'version = "{version}"', f'version = "{release}"')
    dev = repo / "engine" / "dev" / "pyproject.toml"
    replace_once(dev, f'version = "{version}"', f'version = "{release}"')
    replace_once(dev, f"]=={version}", f"]=={release}")
    replace_once(
        repo / PROJECT_CONF,
        "  fail_on_data_loss: true\n",
        "  fail_on_data_loss: true\n  # template commit B: a new comment in the config\n",
    )
    template_transform = repo / USER_PACKAGE / "transform.py"
    template_transform.write_text(template_transform.read_text() + "\n# sample changed in B\n")
    git(repo, "commit", "-q", "-am", "commit B: a new engine release")
    commit_b = git(repo, "rev-parse", "HEAD")
    build_wheels(repo)  # the release's wheels, which the render copies into the project

    behind = cruft(project, home, "check")
    assert behind.returncode == 1, behind.stdout + behind.stderr

    # 4. cruft update brings the change: the project pins the new engine, in one place (the
    # bundle and the README follow the pin), and gains that version's wheels.
    updated = cruft(project, home, "update", "-y")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    pinned = tomllib.loads((project / "pyproject.toml").read_text())["project"]["dependencies"]
    assert pinned == [f"kafka-delta=={release}"], pinned
    for name in ("kafka_delta", "kafka_delta_dev"):
        assert (project / "wheels" / f"{name}-{release}-py3-none-any.whl").is_file(), name
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
        "pyproject.toml",  # the one pin of the engine's version
        f"wheels/kafka_delta-{release}-py3-none-any.whl",
        f"wheels/kafka_delta_dev-{release}-py3-none-any.whl",
    ], changed
    leftovers = [p for p in project.rglob("*") if p.suffix in {".rej", ".orig"}]
    assert not leftovers and "<<<<<<<" not in config


def _has_commit(commit: str) -> bool:
    found = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    return found.returncode == 0


def offline_install(project: Path) -> Path:
    """engine/docs/migration.md's install, `python -m pip install -r engine.txt -e '.[dev]'`,
    into a fresh venv in ``project``, minus dependency resolution (no index here): the venv sees
    this checkout's installed packages through a .pth file, which does not put this checkout's
    engine sources on its path (a .pth in a folder a .pth adds is not read); the engine comes
    from its wheels, where engine.txt points. Returns the venv's python."""
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shared = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "_shared.pth").write_text(shared + "\n")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for args in (
        ["--no-deps", "-r", "engine.txt", "kafka-delta", "kafka-delta-dev"],
        ["--no-deps", "--no-build-isolation", "-e", ".[dev]"],
    ):
        installed = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert installed.returncode == 0, installed.stdout + installed.stderr
    return python


def test_a_project_that_carried_a_copy_of_the_engine_moves_to_the_dependency_in_one_step(
    tmp_path: Path,
) -> None:
    """engine/docs/migration.md, as a user follows it: a project generated at the last release
    that copied the engine into it (src/kafka_delta, src/kafka_delta_dev) takes the engine as a
    dependency with one ``cruft update`` and the README's install; the copies are gone, the
    user's edits survive, and the project's own suite passes on the engine's wheel."""
    if not _has_commit(LAST_RELEASE_WITH_A_COPY):
        pytest.skip(
            f"this clone lacks commit {LAST_RELEASE_WITH_A_COPY[:12]} (a shallow clone): the "
            "migration is tested from the template as it was there"
        )
    home = tmp_path / "home"
    home.mkdir()
    repo = tmp_path / "template-repo"
    repo.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", LAST_RELEASE_WITH_A_COPY, "template"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the engine copied into each project")

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
    assert (project / "src" / "kafka_delta" / "pipeline.py").is_file()  # the copy
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

    # The template moves on: the engine is its own distribution beside it.
    shutil.rmtree(repo / "template")
    copy_template_and_engine(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the engine as a dependency")
    new = git(repo, "rev-parse", "HEAD")

    # The one step: cruft update, then the README's install.
    updated = cruft(project, home, "update", "-y")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert json.loads((project / ".cruft.json").read_text())["commit"] == new
    leftovers = [p for p in project.rglob("*") if p.suffix in {".rej", ".orig"}]
    config = (project / "conf" / "local.yaml").read_text()
    assert not leftovers and "<<<<<<<" not in config, leftovers
    # No copy of the engine is left; src/ holds the user's package alone.
    assert sorted(p.name for p in (project / "src").iterdir()) == ["orders_stream"]
    assert (project / "engine.txt").is_file()
    # The user's edits survive.
    assert "max_records_per_trigger: 1234" in config
    assert (package / "transform.py").read_text() == user_transform

    python = offline_install(project)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"KAFKA_BOOTSTRAP_SERVERS", "PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON"}
    }
    where = subprocess.run(
        [str(python), "-c", "import kafka_delta; print(kafka_delta.__file__)"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert f"{project / '.venv'}" in where and "/site-packages/kafka_delta/" in where, where
    suite = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert suite.returncode == 0, suite.stdout[-6000:] + suite.stderr[-2000:]
    assert " passed" in suite.stdout and "skipped" not in suite.stdout, suite.stdout[-2000:]
