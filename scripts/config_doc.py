"""Write docs/configuration.md from the ``Settings`` dataclass: its fields, defaults and ``#:`` comments.

``python scripts/config_doc.py`` rewrites the page; ``--check`` exits 1 when the page is stale
(the test suite runs the check, so a new setting cannot land undocumented).
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

from dflash_tasks.core.settings import ENV_PREFIX, Settings

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "configuration.md"
SOURCE = REPO / "dflash_tasks" / "core" / "settings.py"

INTRO = f"""# Configuration

Every setting is a field of `dflash_tasks.core.settings.Settings`, one frozen dataclass: each
process (producer, worker, node, monitoring, output) builds it once with `Settings.load()`, from
`{ENV_PREFIX}<FIELD>` environment variables, then the command's flags on top. Nothing else reads
the environment. Secrets (the broker URL's password, the SGLang API key, the Flower password) are
never shown in logs or `repr`.

This page is generated from the dataclass (`python scripts/config_doc.py`); a test fails when it
is stale.
"""


def field_docs() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """``(group, group comment, [(field, comment)])`` in source order."""
    lines = SOURCE.read_text().splitlines()
    cls = next(
        n for n in ast.parse(SOURCE.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "Settings"
    )
    groups: list[tuple[str, str, list[tuple[str, str]]]] = [("general", "", [])]
    prev_end = cls.lineno
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            prev_end = getattr(node, "end_lineno", prev_end) or prev_end
            continue
        comment: list[str] = []
        for raw in lines[prev_end : node.lineno - 1]:
            text = raw.strip()
            if text.startswith("# ---"):
                groups.append((text.strip("# -").strip(), "", []))
                comment = []
            elif text.startswith("#:"):
                comment.append(text[2:].strip())
        groups[-1][2].append((node.target.id, " ".join(comment)))
        prev_end = node.end_lineno or node.lineno
    return [g for g in groups if g[2]]


def render() -> str:
    defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    out = [INTRO]
    for group, _, items in field_docs():
        out.append(f"\n## {group[0].upper() + group[1:]}\n")
        out.append("| variable | default | meaning |\n|---|---|---|")
        for name, comment in items:
            default = defaults[name]
            shown = "" if default in ("", None) else f"`{default}`"
            meaning = comment.replace("|", "\\|") or "(undocumented)"
            out.append(f"| `{ENV_PREFIX}{name.upper()}` | {shown} | {meaning} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    page = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE.relative_to(REPO)} is stale: run python scripts/config_doc.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
