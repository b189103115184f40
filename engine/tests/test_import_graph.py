"""The engine's import graph, read from its sources (every import, the lazy ones inside functions
too): no circle, no arrow up from the Delta layer or the commands into the sinks, the two sinks
apart, and fault injection reached through one seam (kafka_delta.crash_points), never imported
by an engine module. No Spark, no broker: the sources are parsed, not imported."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import kafka_delta

ROOT = Path(kafka_delta.__file__).parent


def _modules() -> dict[str, Path]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imported(name: str, path: Path) -> Iterator[str]:
    """Every name ``name``'s source imports, relative imports made absolute; ``from a import b``
    names ``a.b`` when that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            submodules = [f"{module}.{a.name}" for a in node.names]
            found = [m for m in submodules if m in MODULES]
            yield from found or [module]


def _engine_module(name: str) -> str | None:
    """The engine module an imported name is, or lies in (None: outside the engine)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {_engine_module(m) for m in _imported(name, path)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


GRAPH = _graph()


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_engines_import_graph_has_no_circle() -> None:
    assert len(GRAPH) > 80, sorted(GRAPH)  # the scan found the engine
    assert _circles(GRAPH) == []


def test_the_scan_finds_a_circle_and_an_import_made_inside_a_function() -> None:
    """The checks above rest on the scan: shown a circle, and a lazy relative import, it sees
    them."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    cli = list(_imported("kafka_delta.cli", MODULES["kafka_delta.cli"]))
    assert any(m.startswith("kafka_delta.commands") for m in cli), cli


@pytest.mark.parametrize("layer", ["kafka_delta.delta", "kafka_delta.commands"])
def test_no_arrow_runs_up_from_the_delta_layer_or_the_commands_into_the_sinks(layer) -> None:
    up = {
        name: sorted(t for t in targets if t.startswith("kafka_delta.sinks"))
        for name, targets in GRAPH.items()
        if name.startswith(layer)
    }
    assert {name: targets for name, targets in up.items() if targets} == {}


def test_neither_sink_imports_the_other() -> None:
    rs, spark = "kafka_delta.sinks.delta_rs", "kafka_delta.sinks.delta_spark"
    crossing = {
        name: sorted(t for t in targets if t.startswith(other))
        for name, targets in GRAPH.items()
        for mine, other in ((rs, spark), (spark, rs))
        if name.startswith(mine)
    }
    assert {name: targets for name, targets in crossing.items() if targets} == {}


def test_fault_injection_is_reached_through_one_seam_that_imports_nothing_of_the_engine() -> None:
    """The engine marks its named points through kafka_delta.crash_points and nothing else: no
    engine module holds or imports fault injection (kafka_delta_dev.faults listens at the seam,
    loaded by the seam itself only where KAFKA_DELTA_CRASH_AT is set)."""
    assert not any(name.rpartition(".")[2] == "faults" for name in MODULES), sorted(MODULES)
    importers = {
        name
        for name, path in MODULES.items()
        for module in _imported(name, path)
        if module.startswith("kafka_delta_dev")
    }
    assert importers == set()
    assert GRAPH["kafka_delta.crash_points"] == set()
    marking = {name for name, targets in GRAPH.items() if "kafka_delta.crash_points" in targets}
    assert "kafka_delta.pipeline" in marking and "kafka_delta.kafka.commit_back" in marking


def test_only_the_engine_factory_imports_the_sinks() -> None:
    """The sinks are picked in one place: every other module stands on the interface
    (kafka_delta.engine), the Delta layer, the dead-letter queue and the upsert rule."""
    importers = {
        name
        for name, targets in GRAPH.items()
        if not name.startswith("kafka_delta.sinks")
        and any(t.startswith("kafka_delta.sinks") for t in targets)
    }
    assert importers == {"kafka_delta.engine_factory"}
