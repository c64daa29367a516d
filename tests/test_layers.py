"""The layout's rules, checked on the code: lower layers never import higher ones, no import cycles,
only ``dflash_tasks.coord`` talks to Redis (imports redis or kombu).

Layers, lowest first (docs/architecture.md): core, sim | store, cli | coord | monitoring | producer |
output | workers, and on top the entry-point modules (``dflash_tasks/<command>.py``, ``demo``).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.helpers import REPO

LAYERS = {
    "dflash_tasks.core": 0,
    "dflash_tasks.sim": 0,
    "dflash_tasks.store": 1,
    "dflash_tasks.cli": 1,
    "dflash_tasks.coord": 2,
    "dflash_tasks.monitoring": 3,
    "dflash_tasks.producer": 4,
    "dflash_tasks.output": 5,
    "workers": 6,
}
TOP = 7  # entry points: dflash_tasks/<command>.py, the demo, workers/__main__ and workers/node


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts)


def layer_of(module: str) -> int | None:
    if not module.startswith(("dflash_tasks", "workers")):
        return None
    if module in ("workers.__main__",) or module.startswith("workers.node"):
        return TOP
    for prefix, level in sorted(LAYERS.items(), key=lambda kv: -len(kv[0])):
        if module == prefix or module.startswith(prefix + "."):
            return level
    return TOP  # dflash_tasks.<command>, dflash_tasks.demo


def imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for pkg in ("dflash_tasks", "workers"):
        for path in (REPO / pkg).rglob("*.py"):
            me = module_name(path)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found[me].add(node.module)
                elif isinstance(node, ast.Import):
                    found[me].update(alias.name for alias in node.names)
    return found


def test_no_module_imports_a_higher_layer() -> None:
    wrong = []
    for me, targets in imports().items():
        mine = layer_of(me)
        assert mine is not None
        for target in targets:
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                wrong.append(f"{me} (layer {mine}) imports {target} (layer {theirs})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_worker_side_does_not_import_the_producer() -> None:
    wrong = [
        f"{me} imports {t}"
        for me, targets in imports().items()
        if me.startswith("workers")
        for t in targets
        if t.startswith("dflash_tasks.producer")
    ]
    assert not wrong, "\n".join(wrong)


#: Third-party packages only ``dflash_tasks.coord`` may import: the one room that knows Redis.
COORD_ONLY = ("redis", "kombu")


def test_only_coord_imports_redis_and_kombu() -> None:
    wrong = [
        f"{me} imports {t}"
        for me, targets in imports().items()
        if not me.startswith("dflash_tasks.coord")
        for t in targets
        if t.split(".")[0] in COORD_ONLY
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_only_coord_reaches_past_bookkeeping_to_its_redis_client() -> None:
    # Bookkeeping.client is the raw Redis client: code outside coord asks Bookkeeping instead.
    wrong = [
        f"{path.relative_to(REPO)}: {ast.unparse(node)}"
        for pkg in ("dflash_tasks", "workers")
        for path in (REPO / pkg).rglob("*.py")
        if not module_name(path).startswith("dflash_tasks.coord")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr == "client"
        and "bk" in ast.unparse(node.value).lower().replace("bookkeeping", "bk")
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles_between_modules() -> None:
    graph = imports()
    modules = set(graph)

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    edges = {m: {r for t in ts if (r := resolve(t)) and r != m} for m, ts in graph.items()}
    # a package's __init__ re-exporting its own modules is not a cycle of the code
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in edges.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in edges.get(m, ()):
            if state.get(t) == 1:
                cycles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "\n".join(cycles)
