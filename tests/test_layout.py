"""The dependency direction DESIGN.md asks for, checked on the import statements."""

from __future__ import annotations

import ast
from pathlib import Path

import alpineagents

PACKAGE = Path(alpineagents.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every alpineagents module's imports of alpineagents modules, wherever they are written
    (module level, in a function, under TYPE_CHECKING)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_package_imports_without_a_circle() -> None:
    # The package itself assembles the public API; nothing inside imports it back.
    graph = {k: v - {"alpineagents"} for k, v in _imports().items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    inside = {k for k, v in _imports().items() if "alpineagents" in v}
    assert inside <= {"alpineagents.demo", "alpineagents.cli"}, inside


def test_stores_and_state_know_no_agent_or_model() -> None:
    graph = _imports()
    loop_side = {"alpineagents.agent", "alpineagents.anthropic", "alpineagents.model"}
    for module in (
        "alpineagents.state",
        "alpineagents.history",
        "alpineagents._serialize",
        "alpineagents._saving",
        "alpineagents._resume",
        "alpineagents.store",
        "alpineagents.filestore",
    ):
        if module in graph:
            assert not graph[module] & loop_side, (module, graph[module] & loop_side)


def test_a_store_does_not_import_its_subclasses() -> None:
    assert "alpineagents.filestore" not in _imports()["alpineagents.store"]
