"""Write docs/configuration.md from the settings classes: their fields, defaults and ``#:`` comments.

One section per class of ``dflash_tasks.core.settings`` (each role and the bases they share), in
source order: the class docstring says which commands read it, the table lists the fields the
class itself declares. ``python scripts/config_doc.py`` rewrites the page; ``--check`` exits 1 when
the page is stale (the test suite runs the check, so a new setting cannot land undocumented).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the settings of this checkout, whichever one the venv installed

from dflash_tasks.core import settings as settings_module  # noqa: E402
from dflash_tasks.core.setting_values import ENV_PREFIX  # noqa: E402
from dflash_tasks.core.settings import ROLES, CommonSettings  # noqa: E402

PAGE = REPO / "docs" / "configuration.md"
SOURCE = REPO / "dflash_tasks" / "core" / "settings.py"

INTRO = f"""# Configuration

Settings live in `dflash_tasks.core.settings`: one frozen dataclass per kind of process, all
built by one loader, `<Class>.load()`, from `{ENV_PREFIX}<FIELD>` environment variables with the
command's flags on top. Each process loads only its own class, so it reads (and checks) only the
variables it uses; nothing else reads the environment. Secrets (the broker URL's password, the
SGLang API key, the Flower password) are never shown in logs or `repr`.

| class | loaded by (`python -m` modules, files) | extends |
|---|---|---|
{{roles}}

A variable is declared once, in the lowest class whose processes read it, so a setting two roles
share has one default; where a role changes it, its section says so. This page is generated from
the classes (`python scripts/config_doc.py`); a test fails when it is stale.
"""


def settings_classes() -> list[type[CommonSettings]]:
    """Every settings class of the module (roles and bases), in source order."""
    found = [
        obj
        for _, obj in inspect.getmembers(settings_module, inspect.isclass)
        if issubclass(obj, CommonSettings) and obj.__module__ == settings_module.__name__
    ]
    return sorted(found, key=lambda cls: inspect.getsourcelines(cls)[1])


def inherited(cls: type[CommonSettings]) -> set[str]:
    """The fields a base of ``cls`` declares (``cls`` may give one of them another default)."""
    bases = [base for base in cls.__mro__[1:] if dataclasses.is_dataclass(base)]
    return {f.name for base in bases for f in dataclasses.fields(base)}


def own_field_docs(
    cls: type[CommonSettings], names: set[str] | None = None
) -> list[tuple[str, list[tuple[str, str]]]]:
    """``[(group, [(field, comment)])]`` of the fields ``cls`` itself declares (or redeclares, of
    ``names``), in source order."""
    text = SOURCE.read_text()
    lines = text.splitlines()
    if names is None:
        names = {f.name for f in dataclasses.fields(cls)} - inherited(cls)
    node_of = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    groups: list[tuple[str, list[tuple[str, str]]]] = [("", [])]
    prev_end = node_of.lineno
    for node in node_of.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if not (isinstance(target, ast.Name) and target.id in names):
            prev_end = getattr(node, "end_lineno", prev_end) or prev_end
            continue
        comment: list[str] = []
        for raw in lines[prev_end : node.lineno - 1]:
            stripped = raw.strip()
            if stripped.startswith("# ---"):
                groups.append((stripped.strip("# -").strip(), []))
                comment = []
            elif stripped.startswith("#:"):
                comment.append(stripped[2:].strip())
        groups[-1][1].append((target.id, " ".join(comment)))
        prev_end = node.end_lineno or node.lineno
    return [g for g in groups if g[1]]


def docstring(cls: type) -> str:
    """The class docstring as one paragraph."""
    return " ".join(line.strip() for line in (inspect.getdoc(cls) or "").splitlines() if line.strip())


def code_list(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def readers(cls: type[CommonSettings]) -> list[str]:
    """The commands that read ``cls``'s fields: those of every role that is or extends ``cls``."""
    return [command for role in ROLES if issubclass(role, cls) for command in role.COMMANDS]


def render() -> str:
    roles = "\n".join(
        f"| `{role.__name__}` | {code_list(list(role.COMMANDS))} | "
        f"{code_list([k.__name__ for k in role.__mro__[1:] if k in settings_classes()])} |"
        for role in ROLES
    )
    out = [INTRO.replace("{roles}", roles)]
    for cls in settings_classes():
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        out.append(f"\n## `{cls.__name__}`\n\n{docstring(cls)}\n\nRead by: {code_list(readers(cls))}.\n")
        groups = own_field_docs(cls)
        for group, items in groups:
            if group and len(groups) > 1:
                out.append(f"### {group[0].upper() + group[1:]}\n")
            out.append("| variable | default | meaning |\n|---|---|---|")
            for name, comment in items:
                default = defaults[name]
                shown = "" if default in ("", None) else f"`{default}`"
                meaning = comment.replace("|", "\\|") or "(undocumented)"
                out.append(f"| `{ENV_PREFIX}{name.upper()}` | {shown} | {meaning} |")
            out.append("")
        changed = [item for _, items in own_field_docs(cls, inherited(cls)) for item in items]
        if changed:
            out.append("Defaults it changes:\n")
            for name, comment in changed:
                out.append(f"- `{ENV_PREFIX}{name.upper()}`: `{defaults[name]}` here. {comment}")
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


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
