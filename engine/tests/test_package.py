"""The engine as a package a project depends on: one version everywhere it is written, two
wheels that hold what they should (the engine; its development tools) and nothing else, and a
README whose documentation links resolve."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

import kafka_delta

ENGINE = Path(__file__).resolve().parents[1]
REPO = ENGINE.parent


def _project(path: Path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))["project"]


def test_the_engine_and_its_dev_tools_carry_one_version_everywhere() -> None:
    engine, dev = _project(ENGINE / "pyproject.toml"), _project(ENGINE / "dev" / "pyproject.toml")
    version = engine["version"]
    assert kafka_delta.__version__ == version
    assert dev["version"] == version
    assert f"kafka-delta[spark,report]=={version}" in dev["dependencies"], dev["dependencies"]
    changelog = (ENGINE / "CHANGELOG.md").read_text(encoding="utf-8")
    (newest,) = re.findall(r"^## (\S+)", changelog, re.M)[:1]
    assert newest == version, f"CHANGELOG.md's newest entry is {newest}, the package {version}"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    built = subprocess.run(
        [str(REPO / "scripts" / "engine-wheels"), str(out)],
        env={"PATH": "/usr/bin:/bin", "KD_VENV": str(Path(sys.executable).parents[1])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return {whl.name.split("-")[0]: whl for whl in out.glob("*.whl")}


def _contents(wheel: Path) -> tuple[set[str], list[str]]:
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [
            line.split(":", 1)[1].strip()
            for line in whl.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    return {n.split("/")[0] for n in names if ".dist-info/" not in n}, requires


def test_the_engines_wheel_holds_the_engine_alone_and_leaves_spark_to_the_runtime(
    wheels: dict[str, Path],
) -> None:
    assert set(wheels) == {"kafka_delta", "kafka_delta_dev"}, wheels
    packages, requires = _contents(wheels["kafka_delta"])
    assert packages == {"kafka_delta"}, packages
    unconditional = [r for r in requires if "extra ==" not in r]
    assert not [r for r in unconditional if re.match(r"(pyspark|delta-spark)\b", r)], requires
    assert any(r.startswith("deltalake") for r in unconditional), requires
    assert any(r.startswith("pyspark") and "extra == 'spark'" in r for r in requires), requires


def test_the_dev_wheel_holds_the_development_tools_and_pins_the_engine(
    wheels: dict[str, Path],
) -> None:
    packages, requires = _contents(wheels["kafka_delta_dev"])
    assert packages == {"kafka_delta_dev"}, packages
    version = kafka_delta.__version__
    assert f"kafka-delta[report,spark]=={version}" in requires or (
        f"kafka-delta[spark,report]=={version}" in requires
    ), requires


def test_every_document_the_engines_readme_links_exists() -> None:
    readme = (ENGINE / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert links, "the README links no document"
    missing = [link for link in links if "://" not in link and not (ENGINE / link).is_file()]
    assert not missing, missing
