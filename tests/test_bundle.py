"""A rendered project's Databricks bundle and the two wheels it deploys, checked here, in the
template's own tests, rather than in every user's suite (a project keeps one short test of its
bundle, tests/test_bundle.py, that parses it and names its wheel). On a render of the defaults:
databricks.yml parses, names only variables it declares and no workspace host, and runs an entry
point that exists in the built wheel, with a config that validates; every target's jobs parse as
Databricks jobs; the project's wheel holds the project alone and leaves Spark to the runtime; the
engine's wheel, built by the bundle's own command from where engine.txt says, is the pinned
version and holds the engine without its development tools; both wheels' console script runs.
And the render writes the engine's version once, and no path of the machine that rendered it."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from cookiecutter import config as cookiecutter_config
from cookiecutter.main import cookiecutter
from kafka_delta import load_config

ROOT = Path(__file__).resolve().parents[1]
ENGINE_VERSION = tomllib.loads((ROOT / "engine" / "pyproject.toml").read_text())["project"][
    "version"
]
# The default answers' names.
SLUG = "orders-stream"
PACKAGE = "orders_stream"
STREAM = PACKAGE
MAINTENANCE = f"{PACKAGE}_maintenance"


def _pip(*args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _render(tmp_path_factory: pytest.TempPathFactory, **answers: str) -> Path:
    """A project rendered from this checkout's template with the default answers but
    ``answers``."""
    home = tmp_path_factory.mktemp("cookiecutter")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(cookiecutter_config.DEFAULT_CONFIG, "replay_dir", str(home / "replay"))
        patch.setitem(cookiecutter_config.DEFAULT_CONFIG, "cookiecutters_dir", str(home / "cc"))
        patch.delenv("COOKIECUTTER_CONFIG", raising=False)
        rendered = cookiecutter(
            str(ROOT / "template"),
            no_input=True,
            default_config=True,
            extra_context=answers or None,
            output_dir=str(tmp_path_factory.mktemp("out")),
        )
    assert Path(rendered).name == SLUG
    return Path(rendered)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project rendered from this checkout's template with the default answers."""
    return _render(tmp_path_factory)


@pytest.fixture(scope="module")
def bundle(project: Path) -> dict:
    return yaml.safe_load((project / "databricks.yml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def wheel(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(project))
    (built,) = out.glob("*.whl")
    return built


def _text_files(project: Path) -> dict[str, str]:
    """The render's files as text, by relative path; the engine's wheels (wheels/) are not."""
    return {
        str(path.relative_to(project)): path.read_text(encoding="utf-8")
        for path in sorted(project.rglob("*"))
        if path.is_file() and "wheels" not in path.relative_to(project).parts
    }


def test_the_render_writes_the_engines_version_once_in_its_pin(project: Path) -> None:
    written = {
        name: text.count(ENGINE_VERSION)
        for name, text in _text_files(project).items()
        if ENGINE_VERSION in text
    }
    assert written == {"pyproject.toml": 1}, written
    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["dependencies"] == [f"kafka-delta=={ENGINE_VERSION}"]
    # Every other requirement of the engine follows that pin: none names a version of its own.
    extras = [r for group in pyproject["project"]["optional-dependencies"].values() for r in group]
    engine = [r for r in extras if r.startswith("kafka-delta")]
    assert engine and not [r for r in engine if re.search(r"[=<>~!]", r)], engine
    # The wheels the project installs from are the pinned version's.
    assert sorted(p.name for p in (project / "wheels").iterdir()) == [
        f"kafka_delta-{ENGINE_VERSION}-py3-none-any.whl",
        f"kafka_delta_dev-{ENGINE_VERSION}-py3-none-any.whl",
    ]


def test_the_render_names_no_path_of_the_machine_that_rendered_it(project: Path) -> None:
    places = {str(ROOT), str(project.parent), str(Path.home())}
    found = {
        name: [place for place in places if place in text]
        for name, text in _text_files(project).items()
    }
    assert not {name: where for name, where in found.items() if where}, found
    sources = [
        line for line in (project / "engine.txt").read_text().splitlines() if line[:1] == "-"
    ]
    assert sources == ["--find-links wheels"], sources


def test_the_users_bundle_test_is_short_and_tests_the_users_project(project: Path) -> None:
    """The user's suite keeps a bundle test of its own, not the template's checks of the wheels
    (they are this file)."""
    text = (project / "tests" / "test_bundle.py").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 25, len(text.splitlines())
    assert "zipfile" not in text and "kafka_delta/" not in text and ENGINE_VERSION not in text


def _task(bundle: dict, key: str = STREAM) -> dict:
    (task,) = bundle["resources"]["jobs"][key]["tasks"]
    return task


def test_bundle_declares_every_variable_it_uses_and_hard_codes_no_workspace(
    bundle, project: Path
) -> None:
    text = (project / "databricks.yml").read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{var\.([A-Za-z_][A-Za-z0-9_]*)\}", text))
    assert used <= set(bundle["variables"]), used - set(bundle["variables"])
    assert set(bundle["targets"]) == {"dev", "prod", "serverless"}
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
    # main() hands over to kafka_delta.run, which leaves with the run's real exit status
    entry = re.search(rf"^{re.escape(task['entry_point'])} = (\S+)\.main:main$", scripts, re.M)
    assert entry, scripts
    assert entry.group(1) == PACKAGE


def test_the_wheel_holds_this_project_only_and_depends_on_the_engine_by_version(
    wheel: Path,
) -> None:
    with zipfile.ZipFile(wheel) as whl:
        modules = set(whl.namelist())
    requires = _requires(wheel)
    packages = {n.split("/")[0] for n in modules} - {
        n.split("/")[0] for n in modules if ".dist-info/" in n
    }
    assert packages == {PACKAGE}, packages
    for module in ("main.py", "transform.py"):
        assert f"{PACKAGE}/{module}" in modules, module
    # The engine is a dependency, by version; the development tools are never deployed.
    assert f"kafka-delta=={ENGINE_VERSION}" in requires, requires
    assert not [r for r in requires if r.startswith("kafka-delta-dev") and "extra ==" not in r]


@pytest.fixture(scope="module")
def engine_wheel(bundle, project: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engine's wheel as the bundle's deploy builds it: its `engine` artifact's own command,
    run here with this venv's python (pip finds the wheel where engine.txt says, the project's
    wheels/, with no index), into a folder of this test's. It is the version of the pin."""
    artifact = bundle["artifacts"]["engine"]
    out = tmp_path_factory.mktemp("engine")
    command = artifact["build"].replace(" dist/engine", f" {out}")
    assert command != artifact["build"], artifact["build"]
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        command, shell=True, cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (source,) = artifact["files"]
    (built,) = out.glob(Path(source["source"]).name)
    assert built.name == f"kafka_delta-{ENGINE_VERSION}-py3-none-any.whl", built.name
    return built


def test_the_bundle_deploys_the_engines_wheel_before_the_projects_on_every_compute(
    bundle, engine_wheel: Path
) -> None:
    with zipfile.ZipFile(engine_wheel) as whl:
        modules = set(whl.namelist())
    for module in (
        "kafka_delta/cli.py",
        "kafka_delta/pipeline.py",
        "kafka_delta/sources/spark_kafka.py",
    ):
        assert module in modules, module
    assert not [m for m in modules if m.startswith("kafka_delta_dev/")]
    engine_first = ["./dist/engine/*.whl", "./dist/*.whl"]
    for target in ("dev", "prod", "serverless"):
        for key in (STREAM, MAINTENANCE):
            job = _target_job(bundle, target, key)
            libraries = [lib["whl"] for task in job["tasks"] for lib in task.get("libraries", [])]
            environments = [
                d for e in job.get("environments", []) for d in e["spec"]["dependencies"]
            ]
            assert (libraries or environments) == engine_first, (target, key)


def test_bundle_passes_a_config_that_validates_on_the_cluster_engine(bundle, project: Path) -> None:
    params = _task(bundle)["python_wheel_task"]["parameters"]
    config = params[params.index("--config") + 1]
    relative = config.removeprefix("${workspace.file_path}/")
    assert relative != config, "the config must come from the bundle's synced files"
    cfg = load_config(project / relative, environ={})
    assert (cfg.engine.source, cfg.engine.sink) == ("spark_kafka", "delta_spark")
    assert cfg.spark.master is None  # the job cluster's session is used as it is
    for flag in ("--bootstrap-servers", "--table", "--checkpoint", "--trigger"):
        assert params[params.index(flag) + 1].startswith("${var."), flag


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as whl:
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        return [
            line.split(":", 1)[1].strip()
            for line in whl.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]


def test_neither_wheel_installs_pyspark_or_delta_spark_over_the_runtime(
    wheel: Path, engine_wheel: Path
) -> None:
    for built in (wheel, engine_wheel):
        unconditional = [r for r in _requires(built) if "extra ==" not in r]
        assert not [r for r in unconditional if re.match(r"(pyspark|delta-spark)\b", r)], built
    assert any(r.startswith("confluent-kafka") for r in _requires(engine_wheel))


def test_wheels_console_script_prints_help(wheel: Path, engine_wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    _pip(
        "install", "--no-deps", "--no-index", "--target", str(target), str(wheel), str(engine_wheel)
    )
    (script,) = (target / "bin").glob(SLUG)

    result = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )

    assert result.returncode == 0, result.stderr
    assert "--engine" in result.stdout and "--config" in result.stdout


def _merge(base: object, override: object) -> object:
    """``override`` merged into ``base`` the way a bundle merges a target into the top level:
    mappings key by key, ``tasks`` by ``task_key``, anything else replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    if (
        isinstance(base, list)
        and isinstance(override, list)
        and all(isinstance(t, dict) and "task_key" in t for t in [*base, *override])
    ):
        tasks = {t["task_key"]: t for t in base}
        for task in override:
            key = task["task_key"]
            tasks[key] = _merge(tasks[key], task) if key in tasks else task
        return list(tasks.values())
    return override


def _target_job(bundle: dict, target: str, key: str = STREAM) -> dict:
    """The job as ``databricks bundle deploy -t <target>`` sees it: the target's job fields over
    the top-level job, ``${var.x}`` resolved with the target's variables over the defaults
    (and ``${bundle.target}``); ``${workspace...}`` is left for the workspace to fill in."""
    values = {name: spec.get("default") for name, spec in bundle["variables"].items()}
    for name, value in (bundle["targets"][target].get("variables") or {}).items():
        assert name in values, f"target {target} sets undeclared variable {name}"
        if isinstance(value, dict):
            assert set(value) == {"default"}, f"{target}.{name}: only plain values are resolved"
            value = value["default"]
        values[name] = value
    overrides = (bundle["targets"][target].get("resources") or {}).get("jobs") or {}
    assert set(overrides) <= set(bundle["resources"]["jobs"]), f"{target}: undeclared job"
    job = _merge(bundle["resources"]["jobs"][key], overrides.get(key, {}))

    def resolve(node: object) -> object:
        if isinstance(node, dict):
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        if not isinstance(node, str):
            return node

        def value(match: re.Match[str]) -> str:
            name = match.group(1)
            assert values.get(name) is not None, f"target {target} leaves variable {name} unset"
            return str(values[name])

        whole = re.fullmatch(r"\$\{var\.([A-Za-z_][A-Za-z0-9_]*)\}", node)
        if whole:  # a whole-string reference keeps the variable's type
            value(whole)
            return values[whole.group(1)]
        node = re.sub(r"\$\{var\.([A-Za-z_][A-Za-z0-9_]*)\}", value, node)
        return node.replace("${bundle.target}", target)

    return resolve(job)  # type: ignore[return-value]


def _argument(job: dict, flag: str) -> str:
    params = job["tasks"][0]["python_wheel_task"]["parameters"]
    return params[params.index(flag) + 1]


def test_each_target_writes_its_own_table_checkpoint_and_consumer_group(bundle) -> None:
    targets = sorted(bundle["targets"])
    tables = {t: _argument(_target_job(bundle, t), "--table") for t in targets}
    checkpoints = {t: _argument(_target_job(bundle, t), "--checkpoint") for t in targets}
    groups = {t: _argument(_target_job(bundle, t), "--consumer-group") for t in targets}

    assert len(set(tables.values())) == len(targets), tables
    assert len(set(checkpoints.values())) == len(targets), checkpoints
    assert len(set(groups.values())) == len(targets), groups
    paths = [*tables.values(), *checkpoints.values()]
    for path in paths:
        others = [p for p in paths if p != path]
        assert not [p for p in others if p.startswith(path.rstrip("/") + "/")], (path, others)


@pytest.mark.parametrize("target", ["dev", "prod"])
def test_each_job_cluster_targets_job_parses_as_a_databricks_job(bundle, target: str) -> None:
    jobs = pytest.importorskip("databricks.bundles.jobs", reason="needs databricks-bundles")
    resolved = _target_job(bundle, target)
    assert "${var." not in json.dumps(resolved)

    job = jobs.Job.from_dict(resolved)

    (task,) = job.tasks
    assert task.python_wheel_task.entry_point == SLUG
    assert task.new_cluster.data_security_mode.value == "SINGLE_USER"
    assert [lib.whl for lib in task.libraries] == ["./dist/engine/*.whl", "./dist/*.whl"]
    assert job.max_concurrent_runs == 1
    assert not job.environments
    if target == "prod":
        assert job.continuous.pause_status.value == "UNPAUSED"
        assert _argument(resolved, "--trigger") == "processing-time"
    else:
        assert job.continuous is None
        assert _argument(resolved, "--trigger") == "available-now"


@pytest.mark.parametrize(
    ("where", "misspelt"),
    [
        (("resources", "jobs", "*"), "max_concurent_runs"),  # the job itself
        (("targets", "prod", "resources", "jobs", "*", "tasks", 0, "new_cluster"), "num_worker"),
        (("targets", "prod", "resources", "jobs", "*"), "continous"),  # a target's override
    ],
)
def test_a_misspelt_job_field_is_rejected_by_the_same_parse(
    bundle, where: tuple[object, ...], misspelt: str
) -> None:
    jobs = pytest.importorskip("databricks.bundles.jobs", reason="needs databricks-bundles")
    broken = copy.deepcopy(bundle)
    node: object = broken
    for step in where:
        node = next(iter(node.values())) if step == "*" else node[step]  # type: ignore[index,union-attr]
    node[misspelt] = 1  # type: ignore[index]

    with pytest.raises(ValueError, match=f"Unexpected field '{misspelt}'"):
        jobs.Job.from_dict(_target_job(broken, "prod"))


def test_bundle_declares_exactly_the_streaming_and_the_maintenance_job(bundle) -> None:
    assert set(bundle["resources"]["jobs"]) == {STREAM, MAINTENANCE}


@pytest.mark.parametrize("target", ["dev", "prod", "serverless"])
def test_each_targets_maintenance_job_runs_table_maintain_daily_on_the_streams_table(
    bundle, target: str
) -> None:
    jobs = pytest.importorskip("databricks.bundles.jobs", reason="needs databricks-bundles")

    resolved = _target_job(bundle, target, MAINTENANCE)
    assert "${var." not in json.dumps(resolved)

    job = jobs.Job.from_dict(resolved)

    (task,) = job.tasks
    assert task.python_wheel_task.entry_point == SLUG
    assert job.max_concurrent_runs == 1 and job.continuous is None
    assert job.schedule.quartz_cron_expression == "0 30 3 * * ?"  # once a day
    params = list(task.python_wheel_task.parameters)
    assert params[:2] == ["table", "maintain"]
    stream = _target_job(bundle, target)
    # The same config and table (so the same dead-letter table) as the target's streaming job.
    for flag in ("--config", "--table"):
        assert params[params.index(flag) + 1] == _argument(stream, flag), flag


@pytest.mark.parametrize("key", [STREAM, MAINTENANCE])
def test_the_serverless_target_runs_the_wheel_in_an_environment_on_a_schedule_until_caught_up(
    bundle, key: str
) -> None:
    jobs = pytest.importorskip("databricks.bundles.jobs", reason="needs databricks-bundles")
    resolved = _target_job(bundle, "serverless", key)
    assert "${var." not in json.dumps(resolved)

    job = jobs.Job.from_dict(resolved)

    (task,) = job.tasks
    (environment,) = job.environments
    # No cluster of its own and no cluster library: the environment holds both wheels.
    assert task.new_cluster is None and task.job_cluster_key is None and not task.libraries
    assert task.environment_key == environment.environment_key
    assert list(environment.spec.dependencies) == ["./dist/engine/*.whl", "./dist/*.whl"]
    assert job.continuous is None and job.schedule is not None
    if key == STREAM:
        # Serverless runs streams only until caught up: a processing-time trigger is refused.
        assert _argument(resolved, "--trigger") == "available-now"
        # A Unity Catalog table by name, its checkpoint in a volume.
        name = r"[A-Za-z_]\w*"
        assert re.fullmatch(rf"{name}\.{name}\.{name}", _argument(resolved, "--table"))
        assert _argument(resolved, "--checkpoint").startswith("/Volumes/")


# -- Kafka's secrets: from a secret scope, never a value ------------------------------------------

SCOPE = "team-kafka"
SECRET_REFERENCE = re.compile(r"^\{\{secrets/" + re.escape(SCOPE) + r"/[A-Za-z0-9_.-]+\}\}$")
CONFIG_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
PROTOCOLS = {"sasl_ssl_scram": "SASL_SSL", "sasl_ssl_plain": "SASL_SSL", "mtls": "SSL"}


@pytest.fixture(scope="module", params=sorted(PROTOCOLS))
def secured(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict]:
    """A render for each secured Kafka (kafka_security), its secrets in the scope SCOPE: the
    answer, the project, its bundle."""
    project = _render(tmp_path_factory, kafka_security=request.param, kafka_secret_scope=SCOPE)
    bundle = yaml.safe_load((project / "databricks.yml").read_text(encoding="utf-8"))
    return request.param, project, bundle


def _environments(job: dict) -> list[dict[str, str]]:
    """The environment variables a resolved job gives its tasks: each job cluster's
    spark_env_vars, each serverless environment-variable entry a task selects."""
    entries = {
        e["environment_variables_key"]: (e.get("spec") or {}).get("variables") or {}
        for e in job.get("environment_variables", [])
    }
    found = []
    for task in job["tasks"]:
        if "new_cluster" in task:
            found.append(task["new_cluster"].get("spark_env_vars") or {})
        else:
            found.append(entries.get(task.get("environment_variables_key"), {}))
    return found


def _secret_values(config: dict) -> dict[str, str]:
    """The settings of kafka.client and kafka.jvm_client that hold a secret, by key."""
    clients = {f"client.{k}": v for k, v in (config["kafka"].get("client") or {}).items()}
    clients |= {f"jvm_client.{k}": v for k, v in (config["kafka"].get("jvm_client") or {}).items()}
    return {
        k: str(v)
        for k, v in clients.items()
        if re.search(r"password|secret|jaas|sasl\.username|key\.pem$|keystore\.key$", k)
    }


def test_no_target_holds_a_literal_secret(bundle, secured) -> None:
    """Every environment variable a job of any target gets is a secret reference to the scope
    (or none, unsecured); every secret the config names is a ${NAME} of them."""
    for rendered in (bundle, secured[2]):
        for target in rendered["targets"]:
            for key in (STREAM, MAINTENANCE):
                for variables in _environments(_target_job(rendered, target, key)):
                    literal = {n: v for n, v in variables.items() if not SECRET_REFERENCE.match(v)}
                    assert not literal, (target, key, literal)
    answer, project, _ = secured
    config = yaml.safe_load((project / "conf" / "databricks.yaml").read_text(encoding="utf-8"))
    secrets = _secret_values(config)
    assert secrets, answer
    for key, value in secrets.items():
        if key.endswith("sasl.jaas.config"):
            value = re.sub(r"kafkashaded\.org\.apache\.kafka\.[\w.]+ required ", "", value)
            value = re.sub(r'(username|password)="([^"]*)"', r"\2", value).rstrip(";")
        assert all(CONFIG_REFERENCE.fullmatch(part) for part in value.split()), (key, value)


def test_each_target_gives_both_jobs_every_secret_its_config_reads(secured) -> None:
    """The ${NAME}s conf/databricks.yaml's Kafka settings read are exactly the variables each
    target's jobs get from the scope (a name one job lacks stops it at start-up), and the config
    loads with them, in the answer's protocol on both clients."""
    jobs = pytest.importorskip("databricks.bundles.jobs", reason="needs databricks-bundles")
    answer, project, bundle = secured
    text = (project / "conf" / "databricks.yaml").read_text(encoding="utf-8")
    config = yaml.safe_load(text)
    read = {n for v in _secret_values(config).values() for n in CONFIG_REFERENCE.findall(v)}
    assert read, answer
    for target in bundle["targets"]:
        for key in (STREAM, MAINTENANCE):
            resolved = _target_job(bundle, target, key)
            jobs.Job.from_dict(resolved)  # environment_variables included, as the bundle parses
            for variables in _environments(resolved):
                assert set(variables) == read, (target, key, variables)
    cfg = load_config(project / "conf" / "databricks.yaml", environ=dict.fromkeys(read, "x"))
    protocol = PROTOCOLS[answer]
    assert cfg.kafka.client["security.protocol"] == protocol
    assert cfg.kafka.jvm_client["security.protocol"] == protocol
