"""The house's sizes, for docs/architecture.md and the 400/60-line rule: lines per room, the
modules past 300 lines and the functions past 60 (``python scripts/house_sizes.py``)."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("dflash_tasks", "workers", "benchmarks")


def room_of(rel: Path) -> str:
    """A module's room: its package folder two deep (``dflash_tasks/core``), or a package's top."""
    return "/".join(rel.parts[:2]) if len(rel.parts) > 2 else f"{rel.parts[0]} (top)"


def main() -> int:
    lines: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    big: list[tuple[int, str]] = []
    long: list[tuple[int, str]] = []
    for path in sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")):
        rel = path.relative_to(REPO)
        text = path.read_text()
        n = len(text.splitlines())
        lines[room_of(rel)] += n
        modules[room_of(rel)] += 1
        if n > 300:
            big.append((n, str(rel)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    long.append((length, f"{rel}:{node.name}"))
    print("room | modules | lines")
    for room in sorted(lines):
        print(f"{room} | {modules[room]} | {lines[room]:,}")
    print(f"total | {sum(modules.values())} | {sum(lines.values()):,}")
    print("\nmodules past 300 lines:")
    print("\n".join(f"  {n:5d} {name}" for n, name in sorted(big, reverse=True)))
    print("functions past 60 lines:")
    print("\n".join(f"  {n:5d} {name}" for n, name in sorted(long, reverse=True)) or "  none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
