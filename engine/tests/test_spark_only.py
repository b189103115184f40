"""I14: the cluster engine reaches Delta only through Spark.

Statically (runs everywhere): no module on the cluster path imports ``deltalake`` or touches
``_jvm`` / ``sparkContext`` (an AST scan of the source, following kafka_delta's imports from the
cluster path's entry modules). Where the jars are, dynamically: the contract suite's delta-spark
cases run with ``deltalake`` unimportable from kafka_delta (test_engine_contract.py's fixtures,
:func:`refuse_delta_rs_in_the_engine`), and the commands' reset is delta-spark's own commit.
Also here, with no jars: the side folder (leases, commit copies) beside the checkpoint, and the
one sentence each bad table input gets, on Spark's real exception texts.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import json
from pathlib import Path

import pytest

import kafka_delta
from kafka_delta.offsets.model import BatchCommit

ENGINE = Path(kafka_delta.__file__).parent

# The cluster path's entry modules: the delta-spark sink and its store, the engine factory that
# builds them, the commands as they run on a delta-spark sink, every module of offsets/, the
# run lease, and the Delta layer's side folder, type rules, locations and its Spark half (the
# table through Spark, a commit's options, the offset store, the commit copies). Everything
# they import from kafka_delta is scanned too.
ENTRIES = (
    "kafka_delta.cli",
    "kafka_delta.pipeline",
    "kafka_delta.routing",
    "kafka_delta.sources.spark_kafka",
    "kafka_delta.sources.embedded",
    "kafka_delta.sinks.delta_spark.sink",
    "kafka_delta.delta.spark_offset_store",
    "kafka_delta.delta.commit_copies",
    "kafka_delta.delta.spark_table",
    "kafka_delta.delta.spark_commit",
    "kafka_delta.sinks.delta_spark.widening",
    "kafka_delta.delta.side_folder",
    "kafka_delta.delta.schema",
    "kafka_delta.delta.locations",
    "kafka_delta.engine_factory",
    "kafka_delta.commands.offsets",
    "kafka_delta.commands.reset",
    "kafka_delta.commands.verify",
    "kafka_delta.commands.table",
    "kafka_delta.commands.table_log",
    "kafka_delta.offsets.model",
    "kafka_delta.offsets.stored",
    "kafka_delta.offsets.history",
    "kafka_delta.offsets.fencing",
    "kafka_delta.offsets.topic_identity",
    "kafka_delta.recovery.lease",
)
# Imports that only the embedded engine (engine.sink: delta_rs) takes: each sits in a branch
# the cluster path never enters. (importer, imported): why.
EMBEDDED_BRANCHES = {
    ("kafka_delta.engine_factory", "kafka_delta.sinks.delta_rs.sink"): "engine.sink delta_rs",
    ("kafka_delta.engine_factory", "kafka_delta.delta.rs_offset_store"): "same branch",
    ("kafka_delta.commands.table_log", "kafka_delta.delta.rs_offset_store"): (
        "open_table / table_log for engine.sink delta_rs"
    ),
    ("kafka_delta.recovery.lease", "kafka_delta.delta.table_storage"): (
        "the delta-rs sink's lease folder in its table"
    ),
}
# The sources are scanned too: under Spark Connect (serverless, standard access) the whole run
# goes without a SparkContext, not only its Delta access. (importer, imported): why.
NOT_DELTA: dict[tuple[str, str], str] = {}
# The same, for `deltalake` itself in a cluster-path module: (module, function): why.
EMBEDDED_DELTALAKE = {
    ("kafka_delta.commands.reset", "commit_reset"): "the delta-rs sink's reset commit",
    ("kafka_delta.delta.maintenance", "DeltaRsMaintainer._open"): "the delta-rs maintainer",
    ("kafka_delta.delta.maintenance", "DeltaRsMaintainer.exists"): "the delta-rs maintainer",
}
# runtime/ helpers (the lead's) that touch sparkContext only as a classic-session optimization,
# guarded so that a Spark Connect session skips it: module: why.
KNOWN_RUNTIME = {
    "kafka_delta.runtime.spark_session": (
        "a classic session's log level, default parallelism and local properties; each behind "
        "is_connect(spark), which a Spark Connect session takes the other way"
    ),
    "kafka_delta.runtime.graceful_stop": (
        "forward_from_jvm hands the JVM's stop signal to Python on a classic session; guarded, "
        "returns False under Spark Connect"
    ),
    "kafka_delta.runtime.python_workers": (
        "warm_up starts a classic session's Python workers before the first batch; guarded, "
        "does nothing under Spark Connect (the workers live with the server)"
    ),
}


def _source(module: str) -> Path | None:
    parts = module.split(".")[1:]
    path = ENGINE.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


class _Scan(ast.NodeVisitor):
    """The kafka_delta modules a module imports, and its uses of deltalake / _jvm /
    sparkContext, each with the function it sits in."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.imports: set[str] = set()
        self.findings: list[tuple[str, str]] = []

    def _where(self) -> str:
        return ".".join(self.scope) or "<module>"

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def _imported(self, name: str) -> None:
        if name.split(".")[0] == "deltalake":
            self.findings.append((self._where(), f"imports {name}"))
        if name.startswith("kafka_delta.") or name == "kafka_delta":
            self.imports.add(name)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._imported(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        self._imported(base)
        if base.startswith("kafka_delta"):
            for alias in node.names:
                # `from kafka_delta.delta import side_folder` imports a module too.
                if _source(f"{base}.{alias.name}") is not None:
                    self.imports.add(f"{base}.{alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in ("_jvm", "sparkContext", "_jsc", "_jsparkSession", "_sc"):
            self.findings.append((self._where(), f"touches .{node.attr}"))
        self.generic_visit(node)


def cluster_path() -> dict[str, list[tuple[str, str]]]:
    """Every module reachable from :data:`ENTRIES`, with its findings."""
    seen: dict[str, list[tuple[str, str]]] = {}
    todo = list(ENTRIES)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = _source(module)
        if path is None:
            continue
        scan = _Scan(module)
        scan.visit(ast.parse(path.read_text(), str(path)))
        seen[module] = scan.findings
        todo += [
            m
            for m in scan.imports
            if (module, m) not in EMBEDDED_BRANCHES and (module, m) not in NOT_DELTA
        ]
    return seen


def test_no_module_on_the_cluster_path_imports_deltalake_or_touches_the_jvm() -> None:
    reached = cluster_path()
    assert set(ENTRIES) <= set(reached)
    for importer, imported in {**EMBEDDED_BRANCHES, **NOT_DELTA}:  # each still a real import
        assert importer in reached and _source(imported) is not None
    problems = [
        f"{module} ({where}): {what}"
        for module, findings in sorted(reached.items())
        for where, what in findings
        if module not in KNOWN_RUNTIME
        and not (what.startswith("imports deltalake") and (module, where) in EMBEDDED_DELTALAKE)
    ]
    assert problems == []
    # The delta-rs sink and the Delta layer's delta-rs half are off the cluster path, and the
    # scan would see them if they were not.
    assert not any(m.startswith("kafka_delta.sinks.delta_rs") for m in reached)
    assert "kafka_delta.delta.rs_offset_store" not in reached


def test_the_scan_finds_a_deltalake_import_or_a_jvm_touch_it_is_shown() -> None:
    scan = _Scan("m")
    scan.visit(
        ast.parse(
            "def f(spark):\n"
            "    from deltalake import DeltaTable\n"
            "    return spark.sparkContext._jvm\n"
        )
    )
    assert scan.findings == [
        ("f", "imports deltalake"),
        ("f", "touches ._jvm"),
        ("f", "touches .sparkContext"),
    ]


def refuse_delta_rs_in_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, an import of ``deltalake`` by any kafka_delta module fails (the tests' own
    independent checks, which read tables with delta-rs, still can): with the contract suite's
    delta-spark cases, the dynamic half of I14."""
    real = builtins.__import__

    def guarded(name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__name__", "")
        if name.split(".")[0] == "deltalake" and str(importer).startswith("kafka_delta"):
            raise ImportError(f"{importer} imported deltalake on the cluster path (I14)")
        return real(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", guarded)


def test_the_import_guard_refuses_deltalake_to_the_engine_and_lets_tests_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refuse_delta_rs_in_the_engine(monkeypatch)
    engine_code = compile("from deltalake import DeltaTable", "<engine>", "exec")
    with pytest.raises(ImportError, match="cluster path"):
        exec(engine_code, {"__name__": "kafka_delta.sinks.delta_spark.sink"})
    exec(engine_code, {"__name__": "test_module"})
    assert importlib.util.find_spec("deltalake") is not None


# -- the side folder: leases and commit copies beside the checkpoint (runs here) ---------------


def _spark_config(tmp_path: Path, table: str = "main.sales.orders"):
    from kafka_delta.config import PipelineConfig

    return PipelineConfig.model_validate(
        {
            "pipeline_id": "orders",
            "kafka": {"bootstrap_servers": "127.0.0.1:1", "topics": ["o"], "consumer_group": "g"},
            "delta": {"table": table},
            "checkpoint": str(tmp_path / "checkpoints" / "orders"),
            "engine": {"source": "embedded", "sink": "delta_spark"},
        }
    )


def test_a_delta_spark_runs_lease_lives_beside_its_checkpoint_never_in_the_table(
    tmp_path: Path,
) -> None:
    from kafka_delta.delta.side_folder import table_key
    from kafka_delta.recovery.lease import RunLease, active_leases_of, leases_of

    cfg = _spark_config(tmp_path)
    with RunLease.hold(cfg) as lease:
        assert lease is not None
        (held,) = active_leases_of(cfg)
        side = tmp_path / "checkpoints" / "orders.kafka_delta" / "orders" / "runs"
        assert held.path == str(side / table_key(cfg.delta.table) / f"{held.run_id}.json")
        assert held.checkpoint == cfg.checkpoint
        assert not (tmp_path / "checkpoints" / "orders").exists()  # the checkpoint untouched
        assert not any(p.name in ("main.sales.orders", "orders") for p in Path.cwd().iterdir())
    assert leases_of(cfg) == []
    # A run that wrote nothing leaves no side folder behind.
    assert not (tmp_path / "checkpoints" / "orders.kafka_delta").exists()


def test_one_run_leases_each_of_its_tables_on_one_checkpoint_and_a_second_run_is_refused(
    tmp_path: Path,
) -> None:
    """The tables of a pipeline share its checkpoint: a run holds a lease per table (as the
    pipeline does, one per tables: entry) without refusing itself, and a second run on the
    same checkpoint is refused on the first table it tries."""
    from kafka_delta.config import PipelineConfig
    from kafka_delta.recovery.lease import CheckpointInUseError, RunLease, leases_of

    shared = PipelineConfig.model_validate(
        {
            "pipeline_id": "shop",
            "kafka": {
                "bootstrap_servers": "127.0.0.1:1",
                "topics": ["o", "p"],
                "consumer_group": "g",
            },
            "tables": {
                "orders": {"path": "main.shop.orders", "topics": ["o"]},
                "payments": {"path": "main.shop.payments", "topics": ["p"]},
            },
            "checkpoint": str(tmp_path / "cp"),
            "engine": {"source": "embedded", "sink": "delta_spark"},
        }
    )
    orders, payments = shared.for_table("orders"), shared.for_table("payments")
    with RunLease.hold(orders), RunLease.hold(payments):
        assert [len(leases_of(v)) for v in (orders, payments)] == [1, 1]
        second = RunLease(orders).acquire()
        try:
            with pytest.raises(CheckpointInUseError, match="is in use by another run"):
                second.first_on_checkpoint()
        finally:
            second.release()
    assert leases_of(orders) == leases_of(payments) == []


def test_commit_copies_are_kept_beside_the_checkpoint_per_table_and_the_newest_is_read(
    tmp_path: Path,
) -> None:
    from kafka_delta.delta.commit_copies import CommitCopies
    from kafka_delta.delta.side_folder import table_key

    checkpoint = str(tmp_path / "cp")
    copies = CommitCopies("main.sales.orders", checkpoint, "p")
    other = CommitCopies("main.sales.refunds", checkpoint, "p")
    for seq, end in ((3, 30), (5, 50)):
        commit = BatchCommit("p", "p.q", seq, {"o": {0: end}}, seq=seq)
        copies.write(seq, commit.user_metadata(), 10 + seq)
    other.write(9, BatchCommit("p", "p.q", 9, {"r": {0: 1}}, seq=9).user_metadata(), 40)

    folder = tmp_path / "cp.kafka_delta" / "p" / "commits" / table_key("main.sales.orders")
    assert sorted(p.name for p in folder.iterdir()) == ["3.json", "5.json"]
    assert json.loads((folder / "5.json").read_text())["table"] == "main.sales.orders"
    newest = copies.read()
    assert newest is not None and (newest.seq, newest.offsets) == (5, {"o": {0: 50}})
    # A bound past the newest (the fence after log cleanup) finds the newest below it.
    assert copies.read(1000).seq == 5  # type: ignore[union-attr]
    assert copies.read(4).seq == 3  # type: ignore[union-attr]
    assert copies.read(2) is None
    assert other.read().offsets == {"r": {0: 1}}  # type: ignore[union-attr]
    # A copy of another pipeline or a damaged file is ignored, never trusted.
    (folder / "7.json").write_text("{not json")
    assert copies.read().seq == 5  # type: ignore[union-attr]
    assert not (tmp_path / "cp").exists()


def test_the_side_folder_of_each_sink() -> None:
    from kafka_delta.delta.side_folder import open_side, side_location

    assert side_location("delta_rs", "/t/orders/", "/c/o") == "/t/orders/_kafka_delta"
    assert side_location("delta_spark", "main.s.orders", "/Volumes/main/s/v/cp/") == (
        "/Volumes/main/s/v/cp.kafka_delta"
    )
    filesystem, root = open_side("dbfs:/Volumes/main/s/v/cp.kafka_delta")
    assert (filesystem.type_name, root) == ("local", "/Volumes/main/s/v/cp.kafka_delta")


# -- where the jars are: a pipeline on a table by name, and a reset through delta-spark ---------


@pytest.mark.spark
@pytest.mark.broker
def test_a_table_by_name_takes_the_pipeline_and_a_reset_commits_through_delta_spark(
    spark, kafka_bootstrap, new_topics, make_config, tmp_path: Path, monkeypatch, capsys
) -> None:
    """The cluster engine creates a missing table by name, writes it exactly once, and
    `offsets reset` on it is one commit of delta-spark's own writer (its commitInfo's
    engineInfo names Apache-Spark and Delta-Lake), all with kafka_delta refused deltalake."""
    import yaml

    from conftest import skip_without_connectors
    from kafka_delta.cli import main
    from kafka_delta.offsets.model import parse_user_metadata
    from kafka_delta.pipeline import Pipeline
    from kafka_delta_dev.produce import produce_events

    engine = {"source": "embedded", "sink": "delta_spark"}
    skip_without_connectors(spark, engine)
    schema = f"kd_{tmp_path.name[-12:].replace('-', '_')}"
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {schema} LOCATION '{tmp_path / 'warehouse'}'")
    name = f"{schema}.orders"
    topics = new_topics(1, partitions=2)
    produce_events(kafka_bootstrap, topics, 100)
    cfg = make_config(topics, engine=engine).with_overrides(
        **{"delta.table": name, "dead_letters.table": f"{schema}.orders_dead"}
    )
    refuse_delta_rs_in_the_engine(monkeypatch)

    Pipeline(spark, cfg).run()
    assert spark.table(name).count() == 100
    assert not (Path.cwd() / name).exists()  # a name, never a relative folder
    config = tmp_path / "conf" / "byname.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    argv = ["offsets", "reset", "--config", str(config), "--to-earliest", "--allow-rewind"]
    status = main([*argv, "--execute", "--reason", "replay for a fix"])
    assert status == 0, capsys.readouterr()

    newest = spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first()
    record = parse_user_metadata(newest["userMetadata"], cfg.pipeline_id)
    assert record is not None and record.reset is not None
    assert "Apache-Spark/" in newest["engineInfo"] and "Delta-Lake/" in newest["engineInfo"]
    Pipeline(spark, cfg).run()  # the reset is taken: every record read again, once more
    assert spark.table(name).count() == 200


@pytest.mark.spark
def test_the_commands_on_a_delta_spark_table_go_through_spark_in_one_sentence(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """offsets show / verify / reset and table maintain on a delta-spark sink's table, by name
    or by path, open it through Spark (never delta-rs, which read such tables before), with
    kafka_delta refused deltalake: without delta-spark's jars that is one sentence saying so;
    with them, Spark's answer for a table that is not there (no catalog main, no Delta table at
    the path), one sentence too. Exit code 2 either way, nothing written."""
    import yaml

    from kafka_delta.cli import main
    from kafka_delta.runtime.connectors import missing_connectors

    jars = not missing_connectors(spark, ["delta-spark"])
    refuse_delta_rs_in_the_engine(monkeypatch)
    for table in ("main.sales.orders", str(tmp_path / "orders")):
        data = _spark_config(tmp_path, table).model_dump(mode="json")
        config = tmp_path / "conf" / "spark.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(data))
        common = ["--config", str(config), "--bootstrap-servers", "127.0.0.1:1"]
        if not jars:
            says = ("delta-spark", "jars")
        elif "/" in table:
            says = ("no Delta table at", table)
        else:
            says = ("catalog main does not exist",)
        for argv in (
            ["offsets", "show", *common],
            ["offsets", "verify", *common],
            ["offsets", "reset", *common, "--to-earliest"],
            ["table", "maintain", *common],
        ):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            (line,) = [x for x in err.splitlines() if x.startswith("error:")]
            assert all(part in line for part in says), (argv, err)
            assert "Traceback" not in err
    assert not (tmp_path / "orders").exists() and not (Path.cwd() / "main.sales.orders").exists()
