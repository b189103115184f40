"""The READMEs' quick start works when pasted as is: the template repo's README shows the
generated README's commands, and those commands, run in order in a fresh project, start a
broker, produce, stream, draw the picture and stop, with no address pasted anywhere."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "conf" / "embedded-local.yaml"
ADDRESS = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}:\d+|localhost:\d+|:<?port>?", re.I)


def section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n{heading}\n")
    level = heading.split(" ")[0]
    end = markdown.find(f"\n{level} ", start + len(heading) + 2)
    return markdown[start : end if end >= 0 else None]


def bash_blocks(text: str) -> list[list[str]]:
    """The commands of each ```bash block, without comments and blank lines."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = [[line.split("  #")[0].strip() for line in b.splitlines()] for b in blocks]
    return [[c for c in block if c] for block in commands]


def repo_quick_start() -> tuple[list[str], list[str]]:
    """The repo README's generate commands and the generated project's commands after them."""
    text = section((ROOT / "README.md").read_text(encoding="utf-8"), "## Generate your own project")
    generate, project = bash_blocks(text)[:2]
    return generate, project


def test_repo_readme_shows_the_generated_readmes_quick_start(tmp_path: Path) -> None:
    generate, project_commands = repo_quick_start()
    assert any("--no-input" in c and "embedded-local" in c for c in generate), generate
    rendered = Path(
        cookiecutter(
            str(ROOT / "template"),
            no_input=True,
            config_file=str(PRESET),
            output_dir=str(tmp_path),
        )
    )
    readme = (rendered / "README.md").read_text(encoding="utf-8")
    (generated,) = bash_blocks(section(readme, "## Run it locally"))[:1]

    assert project_commands[0] == f"cd ../{rendered.name}"
    assert project_commands[-1] == "python -m pytest"
    assert project_commands[1:-1] == generated
    # A venv first, then the install into it; scripts the project really has; no address.
    assert generated[0] == "python -m venv .venv && . .venv/bin/activate"
    assert generated[1] == "python -m pip install -r engine.txt -e '.[dev]'"
    for command in generated:
        assert not ADDRESS.search(command), command
        for script in re.findall(r"scripts/\S+", command):
            assert os.access(rendered / script, os.X_OK), script


def fresh_project(tmp_path: Path) -> tuple[list[str], dict[str, str], Path]:
    """A bash script that generates a project as the repo README says and installs it as the
    generated README says (the venv, the install), the environment to run it in, and where the
    project will be: the commands of a README block are appended to the script."""
    generate, project_commands = repo_quick_start()
    # The README's generate block as one runs it without answering questions: the engine's
    # wheels, then the render from the preset.
    prepare = [c for c in generate if "cruft create" not in c or "--no-input" in c]
    assert prepare[0] == "scripts/engine-wheels" and "--no-input" in prepare[-1], prepare
    # "$PWD" of the README is this checkout, whose HEAD cruft clones: use a repository holding
    # the working tree's template and engine instead, with the checkout's .venv beside it.
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", ".ruff_cache", ".pytest_cache")
    for part in ("template", "engine", "conf", "scripts"):
        shutil.copytree(ROOT / part, repo / part, ignore=ignore)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "template"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
            cwd=repo,
            check=True,
            capture_output=True,
        )
    (repo / ".venv").symlink_to(ROOT / ".venv")

    # The install is the README's, minus dependency resolution: the new venv sees this
    # checkout's installed packages through a .pth file (downloading pyspark again per test
    # run would take minutes), and takes the engine from its real wheels, where engine.txt
    # points (that .pth does not put this checkout's engine sources on the path: a .pth in a
    # folder a .pth adds is not read). Everything else runs as written.
    install = "python -m pip install -r engine.txt -e '.[dev]'"
    assert project_commands[2] == install, project_commands
    script = ["set -euo pipefail", "set -x", f"cd {repo}", *prepare]
    for command in project_commands[:3]:  # cd, the venv, the install
        if command == install:
            shared = sysconfig.get_paths()["purelib"]
            script.append(
                "python -c 'import pathlib, sysconfig; pathlib.Path("
                f'sysconfig.get_paths()["purelib"], "_shared.pth").write_text("{shared}\\n")\''
            )
            script.append(
                "python -m pip install --no-deps -r engine.txt kafka-delta kafka-delta-dev"
            )
            command = "python -m pip install --no-deps --no-build-isolation -e '.[dev]'"
            script.append(command)
            # the project runs the engine of its wheel, not of this checkout
            script.append(
                "python -c 'import kafka_delta; where = kafka_delta.__file__; "
                'assert "/site-packages/kafka_delta/" in where, where\''
            )
        else:
            script.append(command)
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "PYTHONPATH",
            "KAFKA_BOOTSTRAP_SERVERS",
            "VIRTUAL_ENV",
            "PYSPARK_PYTHON",
            "SPARK_CLASS_ARCHIVE",
            "XDG_CACHE_HOME",
        }
    }
    env.update(
        HOME=str(tmp_path / "home"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    (tmp_path / "home").mkdir()
    return script, env, tmp_path / "orders-stream"


@pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Spark needs Java 17: java is not on PATH and JAVA_HOME is unset",
)
@pytest.mark.skipif(shutil.which("git") is None, reason="cruft create needs git on PATH")
def test_readme_commands_pasted_in_order_stream_and_draw_without_an_address(
    tmp_path: Path,
) -> None:
    _, project_commands = repo_quick_start()
    assert project_commands[-1] == "python -m pytest"  # the suite: tests/test_generated_project
    script, env, project = fresh_project(tmp_path)
    script += project_commands[3:-1]  # the README's commands after the install
    try:
        run = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        state = project / ".broker.json"
        if state.exists():  # the script stopped before `scripts/broker.sh stop`
            os.kill(json.loads(state.read_text())["pid"], signal.SIGTERM)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]

    assert (project / ".cruft.json").is_file()
    assert "using the broker scripts/broker.sh started" in run.stderr
    assert "produced 10000 records to orders,payments" in run.stdout
    (picture,) = [line for line in run.stdout.splitlines() if line.endswith(".png")]
    assert Path(picture).is_relative_to(project / "data")
    assert Path(picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from deltalake import DeltaTable

    table = DeltaTable(str(project / "data" / "tables" / "orders_stream")).to_pyarrow_table()
    assert table.num_rows == 10000
    assert len(set(table["id"].to_pylist())) == 10000
    assert not (project / ".broker.json").exists()
    # The first run's JVM recorded the class archive of Spark's classes as it exited, complete
    # (the JDK writes the header last), in the user's cache; the next run promotes and maps it.
    assert "records a class archive of Spark's classes" in run.stderr
    (recording,) = (tmp_path / "home" / ".cache" / "spark-class-archive").glob("spark-*.recording")
    assert recording.read_bytes()[:4] == (0xF00BABA8).to_bytes(4, "little")
    # The generated .gitignore keeps what the commands wrote out of the project's repository.
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    untracked = {line[3:].split("/")[0] for line in status if line}
    assert all((project / name).exists() for name in (".venv", "data", ".broker.log"))
    assert untracked == {
        ".cruft.json",
        ".gitignore",
        "README.md",
        "conf",
        "databricks.yml",
        "engine.txt",
        "pyproject.toml",
        "schemas",
        "scripts",
        "src",
        "tests",
        "wheels",  # the engine's wheels, committed with the project (engine.txt)
    }, untracked
    assert not [line for line in status if "__pycache__" in line], status


# The user's transform for the cluster section: a Python UDF that calls a helper module of the
# user's package, which every executor must import (the transform.py a user writes).
ENRICH = """def size_band(amount):
    if amount is None:
        return None
    return "large" if amount >= 250 else "small"
"""
UDF_TRANSFORM = """from kafka_delta import decoded_events
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from orders_stream import enrich


def transform(df: DataFrame) -> DataFrame:
    band = F.udf(enrich.size_band, "string")
    return decoded_events(df).withColumn("band", band(F.col("amount")))
"""


@pytest.mark.skipif(
    shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
    reason="Spark needs Java 17: java is not on PATH and JAVA_HOME is unset",
)
@pytest.mark.skipif(shutil.which("git") is None, reason="cruft create needs git on PATH")
def test_readme_cluster_commands_pasted_in_order_run_a_udf_transform_on_a_standalone_cluster(
    tmp_path: Path,
) -> None:
    """The generated README's "Run on a cluster" block, pasted in order in a fresh project whose
    transform calls a UDF of the user's package: a standalone master and two workers start,
    scripts/submit.sh ships the wheels and runs the pipeline on them, and both stop."""
    rendered = Path(
        cookiecutter(
            str(ROOT / "template"), no_input=True, config_file=str(PRESET), output_dir=str(tmp_path)
        )
    )
    readme = (rendered / "README.md").read_text(encoding="utf-8")
    (block,) = bash_blocks(section(readme, "## Run on a cluster"))[:1]
    assert "scripts/spark_cluster.sh start" in block and "scripts/submit.sh" in block, block
    for command in block:
        assert not ADDRESS.search(command), command
        for script_name in re.findall(r"scripts/\S+", command):
            assert os.access(rendered / script_name, os.X_OK), script_name
    shutil.rmtree(rendered)

    script, env, project = fresh_project(tmp_path)
    package = project / "src" / "orders_stream"
    for name, text in (("enrich.py", ENRICH), ("transform.py", UDF_TRANSFORM)):
        script.append(f"cat > {package / name} <<'PYTHON'\n{text}PYTHON")
    script += block
    try:
        run = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        _stop_leftovers(project)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]

    assert "submitting to the cluster scripts/spark_cluster.sh started" in run.stderr
    assert "shipping kafka_delta-" in run.stderr and "orders_stream-0.1.0" in run.stderr
    from deltalake import DeltaTable

    table = DeltaTable(str(project / "data" / "tables" / "orders_stream")).to_pyarrow_table()
    assert table.num_rows == 10000
    assert len(set(table["id"].to_pylist())) == 10000
    assert table["band"].to_pylist() == [
        "large" if a >= 250 else "small" for a in table["amount"].to_pylist()
    ]
    # The run's executors ran on both workers (each leaves a folder per executor it started).
    for worker in ("worker-0", "worker-1"):
        assert list((project / "data" / "cluster" / worker).glob("app-*/*/stderr")), worker
    assert not (project / ".cluster.json").exists() and not (project / ".broker.json").exists()


def _stop_leftovers(project: Path) -> None:
    """What a script stopped before its `stop` commands left running, by the pids it kept."""
    cluster = project / ".cluster.json"
    if cluster.exists():
        state = json.loads(cluster.read_text())
        for pid in [*state.get("worker_pids", []), state.get("master_pid")]:
            if pid:
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except ProcessLookupError:
                    pass
    broker = project / ".broker.json"
    if broker.exists():
        try:
            os.kill(json.loads(broker.read_text())["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
