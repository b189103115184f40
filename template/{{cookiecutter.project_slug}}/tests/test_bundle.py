"""The Databricks bundle and the wheel it deploys: databricks.yml parses, names only variables
it declares and no workspace host, and runs an entry point that exists in the built wheel,
with a config that validates; the wheel leaves Spark to the runtime and its console script
runs."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from {{ cookiecutter.package_name }}.config import load_config

PROJECT = Path(__file__).resolve().parents[1]
BUNDLE = PROJECT / "databricks.yml"


def _pip(*args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def bundle() -> dict:
    return yaml.safe_load(BUNDLE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(PROJECT))
    (built,) = out.glob("*.whl")
    return built


def _task(bundle: dict) -> dict:
    (job,) = bundle["resources"]["jobs"].values()
    (task,) = job["tasks"]
    return task


def test_bundle_declares_every_variable_it_uses_and_hard_codes_no_workspace(bundle) -> None:
    text = BUNDLE.read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{var\.([A-Za-z_][A-Za-z0-9_]*)\}", text))
    assert used <= set(bundle["variables"]), used - set(bundle["variables"])
    assert set(bundle["targets"]) == {"dev", "prod"}
    assert bundle["targets"]["dev"].get("default") is True
    for section in [bundle, *bundle["targets"].values()]:
        workspace = section.get("workspace", {})
        assert "host" not in workspace and "token" not in workspace, workspace


def test_bundle_runs_an_entry_point_of_the_built_wheel(bundle, wheel: Path) -> None:
    task = _task(bundle)["python_wheel_task"]
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = whl.read(entry_points).decode()
    distribution = wheel.name.split("-")[0]
    assert task["package_name"] == distribution
    assert re.search(rf"^{re.escape(task['entry_point'])} = \S+\.main:main$", scripts, re.M)
    package = "{{ cookiecutter.package_name }}"
    for module in (
        "main.py",
        "engine.py",
        "cluster/sink.py",
        "cluster/source.py",
        "embedded/source.py",
    ):
        assert f"{package}/{module}" in names, module


def test_bundle_passes_a_config_that_validates_on_the_cluster_engine(bundle) -> None:
    params = _task(bundle)["python_wheel_task"]["parameters"]
    config = params[params.index("--config") + 1]
    relative = config.removeprefix("${workspace.file_path}/")
    assert relative != config, "the config must come from the bundle's synced files"
    cfg = load_config(PROJECT / relative, environ={})
    assert (cfg.engine.source, cfg.engine.sink) == ("spark_kafka", "delta_spark")
    assert cfg.spark.master is None  # the job cluster's session is used as it is
    for flag in ("--bootstrap-servers", "--table", "--checkpoint", "--trigger"):
        assert params[params.index(flag) + 1].startswith("${var."), flag


def test_wheel_leaves_pyspark_and_delta_spark_to_the_runtime(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [
            line.split(":", 1)[1].strip()
            for line in whl.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    unconditional = [r for r in requires if "extra ==" not in r]
    assert not [r for r in unconditional if re.match(r"(pyspark|delta-spark)\b", r)], requires
    assert any(r.startswith("confluent-kafka") for r in unconditional), requires


def test_wheels_console_script_prints_help(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    _pip("install", "--no-deps", "--no-index", "--target", str(target), str(wheel))
    (script,) = (target / "bin").glob("{{ cookiecutter.project_slug }}")

    result = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )

    assert result.returncode == 0, result.stderr
    assert "--engine" in result.stdout and "--config" in result.stdout
