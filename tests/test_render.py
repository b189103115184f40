"""Render the template and prove the result is a well-formed project; prove bad answers stop.

Fast on purpose (no Spark, no broker): each render takes about 0.1 s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from cookiecutter import config as cookiecutter_config
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "template"
HOOK = TEMPLATE / "hooks" / "pre_gen_project.py"
PRESETS = sorted((ROOT / "conf").glob("*.yaml"))
ENGINE_VERSION = tomllib.loads((ROOT / "engine" / "pyproject.toml").read_text())["project"][
    "version"
]
TEMPLATE_DEFAULTS = json.loads((TEMPLATE / "cookiecutter.json").read_text(encoding="utf-8"))

# Tool caches left by running ruff/pytest inside template/ are untracked and never reach a
# clone of the repository; they are not rendered output.
CACHE_DIRS = {".ruff_cache", ".pytest_cache", ".mypy_cache", "__pycache__"}
TEMPLATE_MARKERS = (b"{{", b"{%", b"%}")
# Databricks' own secret references ({{secrets/<scope>/<key>}}) belong in databricks.yml.
DATABRICKS_SECRET_REF = re.compile(rb"\{\{secrets/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\}\}")
# What each engine answer puts in conf/local.yaml (conf/databricks.yaml is always "cluster").
ENGINE_PARTS = {
    "embedded": {"source": "embedded", "sink": "delta_rs"},
    "cluster": {"source": "spark_kafka", "sink": "delta_spark"},
}

# Runs in a fresh interpreter so the generated package is imported the way its users import
# it, and nothing of one rendered project leaks into another.
LOAD_CONFIGS = """
import importlib, json, sys
src, package, *paths = sys.argv[1:]
sys.path.insert(0, src)
# The engine is the installed kafka-delta (this venv imports it from engine/), never the project's.
config = importlib.import_module("kafka_delta.config")
contract = importlib.import_module("kafka_delta.contract")
assert not config.__file__.startswith(src), config.__file__
# conf/databricks.yaml of a project on Avro or Protobuf takes the registry URL from the job's
# environment, and a project on secured Kafka its secrets.
environ = {
    "SCHEMA_REGISTRY_URL": "https://schema-registry.invalid",
    "KAFKA_SASL_USERNAME": "user",
    "KAFKA_SASL_PASSWORD": "not-a-secret",
    "KAFKA_KEY_PASSWORD": "not-a-secret",
}
configs = {p: config.load_config(p, environ) for p in paths}
for cfg in configs.values():  # the transform each config names is the project's, importable
    assert contract.load_transform(cfg.transform).__module__ == package + ".transform"
print(json.dumps({p: cfg.model_dump(mode="json") for p, cfg in configs.items()}))
"""


@dataclass(frozen=True)
class Rendered:
    project: Path
    answers: dict[str, Any]  # the context cookiecutter rendered with (from its replay file)


@pytest.fixture(autouse=True)
def _cookiecutter_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # cookiecutter writes a replay file under ~ on every run; keep it in tmp_path, where the
    # tests also read it back to learn the answers a render actually used.
    monkeypatch.setitem(cookiecutter_config.DEFAULT_CONFIG, "replay_dir", str(tmp_path / "replay"))
    monkeypatch.setitem(
        cookiecutter_config.DEFAULT_CONFIG, "cookiecutters_dir", str(tmp_path / "cookiecutters")
    )
    monkeypatch.delenv("COOKIECUTTER_CONFIG", raising=False)


def render(
    tmp_path: Path,
    extra_context: dict[str, str] | None = None,
    config_file: Path | None = None,
) -> Rendered:
    project = cookiecutter(
        str(TEMPLATE),
        no_input=True,
        extra_context=extra_context,
        config_file=str(config_file) if config_file else None,
        # Without a preset, ignore the machine's ~/.cookiecutterrc.
        default_config=config_file is None,
        output_dir=str(tmp_path / "out"),
    )
    replay = json.loads((tmp_path / "replay" / "template.json").read_text(encoding="utf-8"))
    return Rendered(Path(project), replay["cookiecutter"])


def topic_list(answer: str) -> list[str]:
    return [topic.strip() for topic in answer.split(",")]


def load_configs_with_project_loader(rendered: Rendered, paths: list[Path]) -> dict[str, Any]:
    src = rendered.project / "src"
    package = rendered.answers["package_name"]
    argv = [sys.executable, "-I", "-c", LOAD_CONFIGS, str(src), package, *map(str, paths)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_is_valid_project(rendered: Rendered) -> dict[str, Any]:
    """The checks every render must pass; returns the validated configs by file name."""
    project, answers = rendered.project, rendered.answers
    slug, package = answers["project_slug"], answers["package_name"]
    assert project.name == slug

    leftovers = []
    for path in project.rglob("*"):
        relative = path.relative_to(project)
        if CACHE_DIRS & set(relative.parts):
            continue
        if any(marker.decode() in str(relative) for marker in TEMPLATE_MARKERS):
            leftovers.append(f"{relative} (name)")
        if path.is_file() and relative.parts[0] != "wheels":  # the engine's wheels: zip files
            content = DATABRICKS_SECRET_REF.sub(b"", path.read_bytes())
            leftovers += [f"{relative}: {m.decode()}" for m in TEMPLATE_MARKERS if m in content]
    assert not leftovers, f"unrendered template syntax: {leftovers}"

    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["name"] == slug
    assert pyproject["project"]["description"] == answers["description"]
    assert pyproject["project"]["authors"] == [{"name": answers["author_name"]}]
    # run() leaves with the real exit status of main() (process_exit.py)
    assert pyproject["project"]["scripts"] == {slug: f"{package}.main:main"}
    assert (project / "src" / package / "main.py").is_file()
    # The engine is a dependency by version, never a copy: src/ holds the user's package alone,
    # and engine.txt sends pip to the project's wheels/, where the render copied the wheels this
    # checkout's scripts/engine-wheels builds (engine.txt names no path of this machine).
    assert sorted(p.name for p in (project / "src").iterdir()) == [package]
    assert pyproject["project"]["dependencies"] == [f"kafka-delta=={ENGINE_VERSION}"]
    dev = pyproject["project"]["optional-dependencies"]["dev"]
    assert "kafka-delta-dev" in dev, dev  # its version follows the pin (it requires its own)
    sources = [
        line for line in (project / "engine.txt").read_text().splitlines() if line[:1] == "-"
    ]
    assert sources == ["--find-links wheels"], sources
    assert (project / "wheels" / f"kafka_delta-{ENGINE_VERSION}-py3-none-any.whl").is_file()

    bundle = yaml.safe_load((project / "databricks.yml").read_text(encoding="utf-8"))
    assert bundle["bundle"]["name"] == slug
    jobs = bundle["resources"]["jobs"]
    assert set(jobs) == {package, f"{package}_maintenance"}
    for job in jobs.values():
        assert job["tasks"][0]["python_wheel_task"]["entry_point"] == slug
    maintenance = jobs[f"{package}_maintenance"]["tasks"][0]["python_wheel_task"]["parameters"]
    assert maintenance[:2] == ["table", "maintain"]

    conf_files = sorted((project / "conf").glob("*.yaml"))
    assert {project / "conf" / "local.yaml", project / "conf" / "databricks.yaml"} <= set(
        conf_files
    )
    for conf in conf_files:
        raw = yaml.safe_load(conf.read_text(encoding="utf-8"))
        assert raw["kafka"]["topics"] == topic_list(answers["topics"]), conf.name

    configs = load_configs_with_project_loader(rendered, conf_files)
    for conf in conf_files:
        cfg = configs[str(conf)]
        assert cfg["kafka"]["topics"] == topic_list(answers["topics"]), conf.name
        assert cfg["kafka"]["consumer_group"] == answers["consumer_group"]
        assert cfg["kafka"]["bootstrap_servers"] == answers["kafka_bootstrap_servers"]
        assert cfg["pipeline_id"] == answers["pipeline_id"]
        expected_engine = "cluster" if conf.name == "databricks.yaml" else answers["engine"]
        assert cfg["engine"] == ENGINE_PARTS[expected_engine], conf.name
    return {Path(path).name: cfg for path, cfg in configs.items()}


def assert_no_project_left(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir()), list(out.rglob("*"))


def load_hook() -> ModuleType:
    # Before rendering, the hook is plain Python (its Jinja sits inside a string).
    spec = importlib.util.spec_from_file_location("pre_gen_project_under_test", HOOK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # No __pycache__ next to the hook: everything under template/ is template material.
    dont_write_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write_bytecode
    return module


# --- renders that must succeed -------------------------------------------------------------


def test_defaults_render_a_valid_project(tmp_path: Path) -> None:
    rendered = render(tmp_path)

    configs = assert_is_valid_project(rendered)

    assert rendered.project.name == "orders-stream"
    assert rendered.answers["package_name"] == "orders_stream"
    local = configs["local.yaml"]
    assert local["kafka"]["topics"] == ["orders"]
    assert local["delta"]["table"] == str(rendered.project / "data/tables/orders_stream")
    assert local["checkpoint"] == str(rendered.project / "data/checkpoints/orders_stream")


def test_there_is_at_least_one_preset() -> None:
    assert PRESETS, "conf/*.yaml holds no preset"


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_renders_a_valid_project_with_every_answer_it_sets(
    tmp_path: Path, preset: Path
) -> None:
    preset_answers = yaml.safe_load(preset.read_text(encoding="utf-8"))["default_context"]

    rendered = render(tmp_path, config_file=preset)

    assert_is_valid_project(rendered)
    # cookiecutter only warns about a preset answer it cannot use (e.g. an engine missing from
    # cookiecutter.json's choices) and renders the default instead: catch that here.
    for name, value in preset_answers.items():
        assert name in TEMPLATE_DEFAULTS, f"{preset.name}: unknown answer {name!r}"
        assert rendered.answers[name] == value, f"{preset.name}: {name} was not applied"


def test_embedded_local_preset_renders_the_demo_project(tmp_path: Path) -> None:
    rendered = render(tmp_path, config_file=ROOT / "conf" / "embedded-local.yaml")

    configs = assert_is_valid_project(rendered)

    assert rendered.project.name == "orders-stream"
    assert configs["local.yaml"]["kafka"]["topics"] == ["orders", "payments"]
    assert configs["local.yaml"]["kafka"]["bootstrap_servers"] == "127.0.0.1:9092"
    assert configs["local.yaml"]["engine"] == ENGINE_PARTS["embedded"]


def test_awkward_answers_render_files_that_still_parse(tmp_path: Path) -> None:
    answers = {
        "project_name": 'Café "Ørders" — l\'été',
        "description": "Says \"hi\" from C:\\data\\new,\nthen a second line with 'quotes'.",
        "author_name": "Dana O'Brien-Łukasz",
        "topics": " a.b , c_d,e-f ",
        "table": 'data/tables/l\'été "Ørders" #1',
    }

    rendered = render(tmp_path, extra_context=answers)

    configs = assert_is_valid_project(rendered)
    assert rendered.project.name == "cafe-orders-l-ete"
    assert rendered.answers["package_name"] == "cafe_orders_l_ete"
    assert rendered.answers["description"] == answers["description"]
    assert configs["local.yaml"]["kafka"]["topics"] == ["a.b", "c_d", "e-f"]
    assert configs["local.yaml"]["delta"]["table"] == str(rendered.project / answers["table"])


def test_hook_reads_answers_with_triple_quotes_and_backslashes_as_data(tmp_path: Path) -> None:
    rendered = render(
        tmp_path, extra_context={"project_name": 'Ends in """ and \\', "project_slug": "quoted"}
    )

    assert rendered.project.name == "quoted"
    assert rendered.answers["project_name"] == 'Ends in """ and \\'


def test_answers_outside_the_basic_multilingual_plane_still_parse(tmp_path: Path) -> None:
    rendered = render(
        tmp_path,
        extra_context={
            "description": "Streams orders 🚀",
            "table": "data/ü😀",
            "author_name": "Zoë 🐍",
        },
    )

    assert_is_valid_project(rendered)


def test_rendered_default_project_passes_ruff(tmp_path: Path) -> None:
    rendered = render(tmp_path)

    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."],
        cwd=rendered.project,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stdout + result.stderr


# --- answers that must be refused ----------------------------------------------------------

SHADOWED = [
    "pyspark", "delta", "deltalake", "confluent_kafka", "pyarrow", "pandas", "pydantic",
    "yaml", "json", "logging", "test", "tests", "kafka",
]  # fmt: skip

INVALID_ANSWERS = [
    ({"project_name": "   ", "project_slug": "blank"}, "project_name must not be empty"),
    ({"project_slug": "Orders"}, "project_slug 'Orders' must start with a lowercase letter"),
    ({"project_slug": "orders_stream"}, "project_slug 'orders_stream' must start with"),
    ({"project_name": "2024 Orders"}, "project_slug '2024-orders' must start with"),
    ({"project_name": "!!!"}, "project_slug '' must start with a lowercase letter"),
    ({"package_name": "orders-stream"}, "package_name 'orders-stream' must be a lowercase"),
    ({"package_name": "Orders"}, "package_name 'Orders' must be a lowercase Python identifier"),
    ({"package_name": "class"}, "package_name 'class' is a Python keyword"),
    *(
        ({"package_name": name}, f"package_name {name!r} would shadow a standard-library")
        for name in SHADOWED
    ),
    ({"topics": ""}, "topics must list at least one Kafka topic"),
    ({"topics": "  "}, "topics must list at least one Kafka topic"),
    ({"topics": "orders,,payments"}, "topics 'orders,,payments' has an empty item"),
    ({"topics": "orders, "}, "topics 'orders, ' has an empty item"),
    ({"topics": "orders,bad topic"}, "topics item 'bad topic' is not a valid Kafka topic name"),
    ({"topics": "orders/eu"}, "topics item 'orders/eu' is not a valid Kafka topic name"),
    ({"topics": "."}, "topics item '.' is not a valid Kafka topic name"),
    ({"topics": "orders,.."}, "topics item '..' is not a valid Kafka topic name"),
    ({"topics": "t" * 250}, f"topics item {'t' * 250!r} is not a valid Kafka topic name"),
    ({"topics": "orders,payments, orders"}, "topics lists 'orders' more than once"),
    ({"topics": "orders.eu,orders_eu"}, "topics 'orders.eu' and 'orders_eu' collide"),
    ({"consumer_group": " "}, "consumer_group must not be empty"),
    ({"consumer_group": "my group"}, "consumer_group 'my group' must not contain whitespace"),
    ({"consumer_group": 'a"""b\\ c'}, 'consumer_group \'a"""b\\\\ c\' must not contain'),
    ({"kafka_bootstrap_servers": ""}, "kafka_bootstrap_servers must be a comma-separated list"),
    ({"kafka_bootstrap_servers": "localhost"}, "item 'localhost' is not valid"),
    ({"kafka_bootstrap_servers": "localhost:0"}, "item 'localhost:0' is not valid"),
    ({"kafka_bootstrap_servers": "localhost:65536"}, "item 'localhost:65536' is not valid"),
    ({"kafka_bootstrap_servers": "localhost:http"}, "item 'localhost:http' is not valid"),
    ({"kafka_bootstrap_servers": ":9092"}, "item ':9092' is not valid"),
    ({"kafka_bootstrap_servers": "a:9092,,b:9092"}, "item '' is not valid"),
    ({"kafka_bootstrap_servers": "my host:9092"}, "item 'my host:9092' is not valid"),
    ({"table": " "}, "table must not be empty"),
    ({"table": "orders"}, "table 'orders' is neither a path nor a table name: write a folder"),
    ({"table": "main.sales.orders", "engine": "embedded"}, "only the cluster engine writes"),
    ({"checkpoint": ""}, "checkpoint must not be empty"),
    ({"table": "data/x", "checkpoint": "data/x"}, "table and checkpoint must be different"),
    ({"table": "data/x", "checkpoint": "./data//x/"}, "table and checkpoint must be different"),
    (
        {"table": "data/t", "checkpoint": "data/t/_checkpoint"},
        "checkpoint 'data/t/_checkpoint' must not be inside the table 'data/t'",
    ),
    (
        {"table": "s3://b/state/table", "checkpoint": "s3://b/state/"},
        "table 's3://b/state/table' must not be inside the checkpoint 's3://b/state/'",
    ),
    ({"pipeline_id": "-orders"}, "pipeline_id '-orders' must start with a letter or digit"),
    ({"pipeline_id": "orders stream"}, "pipeline_id 'orders stream' must start with"),
    ({"pipeline_id": "p" * 129}, "(at most 128 characters)"),
]


@pytest.mark.parametrize(
    ("answers", "message"),
    INVALID_ANSWERS,
    ids=[f"{next(iter(a))}={next(iter(a.values()))!r:.40}" for a, _ in INVALID_ANSWERS],
)
def test_invalid_answer_stops_generation_with_its_message(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], answers: dict[str, str], message: str
) -> None:
    with pytest.raises(FailedHookException):
        render(tmp_path, extra_context=answers)

    err = capfd.readouterr().err
    assert "Invalid answer: " in err and message in err, err
    assert_no_project_left(tmp_path)


def test_invalid_answer_fails_the_cookiecutter_cli_with_its_message(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("COOKIECUTTER_CONFIG", None)
    out = tmp_path / "out"

    command = [sys.executable, "-m", "cookiecutter", "--no-input", "--default-config"]
    command += ["--output-dir", str(out), str(TEMPLATE), "topics=orders,bad topic"]

    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )

    assert result.returncode != 0
    assert "Invalid answer: topics item 'bad topic' is not a valid Kafka topic name" in (
        result.stderr
    )
    assert_no_project_left(tmp_path)


def test_engine_missing_from_the_template_choices_is_refused(tmp_path: Path) -> None:
    # cookiecutter itself refuses a value outside a choice variable, before the hook runs.
    with pytest.raises(ValueError, match="choice variable engine"):
        render(tmp_path, extra_context={"engine": "flink"})

    assert_no_project_left(tmp_path)


def test_cluster_engine_answer_renders_a_project_whose_local_config_uses_it(
    tmp_path: Path,
) -> None:
    rendered = render(tmp_path, extra_context={"engine": "cluster"})

    configs = assert_is_valid_project(rendered)

    assert configs["local.yaml"]["engine"] == ENGINE_PARTS["cluster"]
    assert configs["databricks.yaml"]["engine"] == ENGINE_PARTS["cluster"]
    assert (rendered.project / "scripts" / "run_cluster_local.sh").stat().st_mode & 0o111
    bundle = yaml.safe_load((rendered.project / "databricks.yml").read_text(encoding="utf-8"))
    assert bundle["bundle"]["name"] == rendered.answers["project_slug"]


@pytest.mark.parametrize("value_format", ["avro", "protobuf"])
def test_a_value_format_answer_renders_configs_that_decode_it_behind_a_registry(
    tmp_path: Path, value_format: str
) -> None:
    rendered = render(tmp_path, extra_context={"value_format": value_format})

    configs = assert_is_valid_project(rendered)

    for name in ("local.yaml", "databricks.yaml"):
        decoding = configs[name]["decoding"]
        assert decoding["value"]["format"] == value_format, name
        assert decoding["value"]["schema_file"] is None, name
        assert decoding["schema_registry"]["url"], name
    produce = (rendered.project / "scripts" / "produce.sh").read_text(encoding="utf-8")
    assert f"--format {value_format}" in produce


@pytest.mark.parametrize(
    ("security", "protocol"),
    [("sasl_ssl_scram", "SASL_SSL"), ("sasl_ssl_plain", "SASL_SSL"), ("mtls", "SSL")],
)
def test_a_kafka_security_answer_secures_both_clients_of_the_databricks_config(
    tmp_path: Path, security: str, protocol: str
) -> None:
    """The Databricks config speaks the answer's protocol on both clients, its secrets read
    from the job's environment, which the project's own config test provides; the local config
    stays on the unsecured development broker."""
    rendered = render(tmp_path, extra_context={"kafka_security": security})

    configs = assert_is_valid_project(rendered)

    kafka = configs["databricks.yaml"]["kafka"]
    assert kafka["client"]["security.protocol"] == protocol
    assert kafka["jvm_client"]["security.protocol"] == protocol
    assert not configs["local.yaml"]["kafka"]["client"].get("security.protocol")
    text = (rendered.project / "conf" / "databricks.yaml").read_text(encoding="utf-8")
    read = set(re.findall(r"^[^#]*?\$\{([A-Z_]+)\}", text, re.M))
    test = (rendered.project / "tests" / "test_config.py").read_text(encoding="utf-8")
    assert read and all(f'"{name}": ' in test for name in read), read


def test_the_default_project_decodes_json_against_its_schema_file(tmp_path: Path) -> None:
    rendered = render(tmp_path)

    configs = assert_is_valid_project(rendered)

    for name in ("local.yaml", "databricks.yaml"):
        value = configs[name]["decoding"]["value"]
        assert value["format"] == "json", name
        assert value["schema_file"].endswith("schemas/order_event.ddl"), name
    assert (rendered.project / "schemas" / "order_event.ddl").is_file()


# --- the hook's rules, called directly -----------------------------------------------------


def test_hook_refuses_an_engine_it_does_not_support() -> None:
    hook = load_hook()

    assert hook.validate({"engine": "embedded"}) == []
    assert hook.validate({"engine": "cluster"}) == []
    assert hook.validate({"engine": "flink"}) == [
        "engine 'flink' is not supported; choose one of: cluster, embedded."
    ]


def test_hook_refuses_answers_that_are_not_text() -> None:
    assert load_hook().validate({"topics": ["orders"]}) == [
        "topics must be a text answer, not list."
    ]


def test_hook_accepts_every_default_answer() -> None:
    defaults = {
        "project_name": "Orders Stream",
        "project_slug": "orders-stream",
        "package_name": "orders_stream",
        "topics": "orders",
        "consumer_group": "orders-stream",
        "kafka_bootstrap_servers": "127.0.0.1:9092",
        "table": "data/tables/orders_stream",
        "checkpoint": "data/checkpoints/orders_stream",
        "pipeline_id": "orders-stream",
        "engine": "embedded",
        "value_format": "json",
    }

    assert load_hook().validate(defaults) == []
    assert load_hook().validate({"value_format": "thrift"}) == [
        "value_format 'thrift' is not supported; choose one of: avro, json, protobuf."
    ]


def test_hook_refuses_a_kafka_security_or_secret_scope_it_cannot_use() -> None:
    hook = load_hook()

    assert hook.validate({"kafka_security": "mtls", "kafka_secret_scope": "team.kafka@eu-1"}) == []
    assert hook.validate({"kafka_security": "kerberos"}) == [
        "kafka_security 'kerberos' is not supported; choose one of: mtls, none, sasl_ssl_plain, "
        "sasl_ssl_scram."
    ]
    assert hook.validate({"kafka_secret_scope": "kafka secrets"}) == [
        "kafka_secret_scope 'kafka secrets' is not a Databricks secret scope name (1-128 "
        "letters, digits, '_', '-', '.' or '@')."
    ]


@pytest.mark.parametrize(
    "answers",
    [
        {"topics": "t" * 249},
        {"topics": "orders.eu,orders-eu,Orders_EU"},
        {"kafka_bootstrap_servers": "[::1]:9092, broker-1.example.com:19092,10.0.0.7:65535"},
        {"table": "data/t", "checkpoint": "data/t2"},
        {"table": "s3://bucket/tables/t", "checkpoint": "s3://bucket/checkpoints/t"},
        {"pipeline_id": "p" * 128},
        {"package_name": "_private"},
        {"consumer_group": "orders.v2_group-1"},
    ],
    ids=lambda answers: f"{next(iter(answers))}",
)
def test_hook_accepts_answers_at_the_edge_of_each_rule(answers: dict[str, str]) -> None:
    assert load_hook().validate(answers) == []


# "docs/design.md section 3", "docs/design.md sections 4 and 5": what the engine's comments cite.
DESIGN_CITATION = re.compile(r"docs/design\.md sections? (\d+(?:(?:, | and )\d+)*)")


def test_every_design_section_the_engine_cites_ships_with_it(tmp_path: Path) -> None:
    """The engine's comments cite its design notes by section: each cited section is a heading of
    engine/docs/design.md, which ships with the engine (a generated project holds no copy), and
    nothing cites the repository's contributor notes (DESIGN.md), which ship nowhere."""
    design = ROOT / "engine" / "docs" / "design.md"
    assert design.is_file(), "the design notes the engine's code cites are missing"
    headings = set(re.findall(r"^## (\d+)\. \S", design.read_text(encoding="utf-8"), re.M))
    project = render(tmp_path).project
    sources = [ROOT / "engine" / "src", ROOT / "engine" / "dev" / "src", ROOT / "engine" / "tests"]

    cited: dict[str, set[str]] = {}
    stale = []
    for folder in [*sources, project]:
        for path in sorted(folder.rglob("*")):
            if not path.is_file() or CACHE_DIRS & set(path.parts):
                continue
            relative = str(path.relative_to(ROOT if folder != project else project))
            text = path.read_text(encoding="utf-8", errors="replace")
            for numbers in DESIGN_CITATION.findall(text):
                for number in re.findall(r"\d+", numbers):
                    cited.setdefault(number, set()).add(relative)
            if "DESIGN.md" in text:
                stale.append(relative)

    assert cited, "no code cites docs/design.md: the check would pass vacuously"
    missing = {n: sorted(files) for n, files in cited.items() if n not in headings}
    assert not missing, f"cited sections with no '## N.' heading in {design}: {missing}"
    assert not stale, f"files citing DESIGN.md, which ships nowhere: {stale}"


@pytest.mark.parametrize("named", ["template", "./template/", "."])
def test_the_render_copies_this_checkouts_wheels_however_the_template_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, named: str
) -> None:
    """A relative template path (``cookiecutter template``, the README's one-off) is resolved
    against the checkout, not the folder cookiecutter renders in: the project's wheels/ holds
    the checkout's wheels, where its engine.txt points."""
    monkeypatch.chdir(TEMPLATE if named == "." else ROOT)
    project = Path(
        cookiecutter(named, no_input=True, default_config=True, output_dir=str(tmp_path / "out"))
    )
    sources = [
        line for line in (project / "engine.txt").read_text().splitlines() if line[:1] == "-"
    ]
    assert sources == ["--find-links wheels"], sources
    for name in ("kafka_delta", "kafka_delta_dev"):
        wheel = f"{name}-{ENGINE_VERSION}-py3-none-any.whl"
        assert (project / "wheels" / wheel).read_bytes() == (ROOT / "dist" / wheel).read_bytes()


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (
            "https://github.com/acme/kd-template.git",
            "https://github.com/acme/kd-template/releases/expanded_assets/v{v}",
        ),
        (
            "git@github.com:acme/kd-template.git",
            "https://github.com/acme/kd-template/releases/expanded_assets/v{v}",
        ),
        ("https://gitlab.com/acme/kd-template.git", "wheels"),
        ("/some/checkout", "wheels"),
    ],
)
def test_engine_txt_names_a_release_page_or_the_projects_own_folder(
    template: str, expected: str
) -> None:
    """What a project's engine.txt names holds on any machine: a GitHub template's release of the
    pinned version, or else the project's wheels/; the local checkout's dist/ is only where the
    render copies from."""
    spec = importlib.util.spec_from_file_location("engine_source", TEMPLATE / "engine_source.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    assert module.engine_find_links({"_template": template}) == expected.format(v=ENGINE_VERSION)
    assert module.engine_dist({"_template": "/some/checkout"}) == "/some/checkout/dist"
    assert module.engine_dist({"_template": template}) == (
        "" if "://" in template or template.startswith("git@") else "/some/checkout/dist"
    )
