"""SGLang's command-line flags and MTP architectures, read from its source with ``ast``.

Nothing is imported: SGLang needs torch and CUDA. The rules follow the pinned release's own
``ServerArgs.add_cli_args`` (``srt/server_args.py``), which registers

* every field of the namespace classes it collects (``_INPUT_NAMESPACES``, defined in
  ``srt/arg_groups/fields/*.py``) that is annotated ``A[T, "help"]`` or ``A[T, Arg(...)]``,
  through ``add_cli_args_from_dataclass`` (``srt/arg_groups/arg_utils.py``): the name is
  ``Arg.cli_name`` or ``--`` + the field name with ``_`` turned into ``-``, plus
  ``Arg.aliases``; ``Arg(no_cli=True)`` is skipped; ``argparse.BooleanOptionalAction`` adds
  ``--no-NAME``; a ``bool`` is a switch, a ``List[...]`` takes ``+`` values;
* each literal ``parser.add_argument("--x", ...)`` in ``add_cli_args`` itself;
* argparse's own ``-h`` / ``--help``.

Each flag maps to its argparse ``nargs``: 0 for a switch, None for one value, or ``"?"``,
``"*"``, ``"+"``. An extractor that misses a rule fails ``test_sglang_release.py``'s sanity
checks, or the flag check of a flag we use.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

Nargs = int | str | None
_SWITCH_ACTIONS = {"store_true", "store_false", "BooleanOptionalAction", "DeprecatedStoreTrueAction"}


class Source(Protocol):
    def read(self, path: str) -> str: ...
    def listdir(self, folder: str) -> list[str]: ...


def _const(node: ast.expr | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _name(node: ast.expr | None) -> str:
    """``x`` for ``x`` and ``a.b.x``; "" otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _strings(node: ast.expr | None) -> list[str]:
    if isinstance(node, ast.List | ast.Tuple):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _is_help(node: ast.expr) -> bool:
    """A bare help string (``_unwrap_annotated`` takes any ``str``): literal, f-string, or sum."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    return isinstance(node, ast.BinOp) and _is_help(node.left)


def _unwrap_optional(node: ast.expr) -> ast.expr:
    """``Optional[X]``, ``X | None`` and ``Union[X, None]`` -> ``X``."""
    if isinstance(node, ast.Subscript) and _name(node.value) == "Optional":
        return node.slice
    if isinstance(node, ast.Subscript) and _name(node.value) == "Union":
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rest = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
        return rest[0] if len(rest) == 1 else node
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        for a, b in ((node.left, node.right), (node.right, node.left)):
            if isinstance(b, ast.Constant) and b.value is None:
                return a
    return node


def _field_nargs(tp: ast.expr, arg: dict[str, ast.expr]) -> Nargs:
    """The ``nargs`` ``add_cli_args_from_dataclass`` gives a field of type ``tp``."""
    action = _name(arg.get("action"))
    if action:
        kwargs = arg.get("action_kwargs")
        if isinstance(kwargs, ast.Dict):
            for key, value in zip(kwargs.keys, kwargs.values, strict=True):
                if _const(key) == "nargs":
                    return _const(value)  # type: ignore[return-value]
        return 0 if action in _SWITCH_ACTIONS else None
    nargs = _const(arg.get("nargs"))
    inner = _unwrap_optional(tp)
    head = _name(inner.value) if isinstance(inner, ast.Subscript) else ""
    if head == "Literal":
        return None
    if head in ("List", "list") and "type_parser" not in arg:
        return nargs or "+"  # type: ignore[return-value]
    if _name(inner) == "bool":
        return 0
    return nargs  # type: ignore[return-value]


def _annotated(node: ast.expr) -> tuple[ast.expr, list[ast.expr]] | None:
    """``A[T, meta, ...]`` / ``Annotated[...]`` -> (T, [meta, ...])."""
    if (
        isinstance(node, ast.Subscript)
        and _name(node.value) in ("A", "Annotated")
        and isinstance(node.slice, ast.Tuple)
        and len(node.slice.elts) >= 2
    ):
        return node.slice.elts[0], node.slice.elts[1:]
    return None


def _class_fields(cls: ast.ClassDef) -> Iterator[tuple[list[str], Nargs]]:
    """The option strings and nargs of each CLI field of one namespace class."""
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        ann = _annotated(stmt.annotation)
        if ann is None:
            continue
        tp, metas = ann
        arg: dict[str, ast.expr] | None = None
        for meta in metas:  # the first Arg or str wins, as in _unwrap_annotated
            if isinstance(meta, ast.Call) and _name(meta.func) == "Arg":
                arg = {k.arg: k.value for k in meta.keywords if k.arg}
                break
            if _is_help(meta):
                arg = {}
                break
        if arg is None or _const(arg.get("no_cli")) is True:
            continue
        cli = _const(arg.get("cli_name"))
        name = cli if isinstance(cli, str) else "--" + stmt.target.id.replace("_", "-")
        names = [name, *_strings(arg.get("aliases"))]
        if _name(arg.get("action")) == "BooleanOptionalAction":
            names += ["--no-" + n[2:] for n in list(names) if n.startswith("--")]
        yield names, _field_nargs(tp, arg)


def _input_namespaces(server_args: ast.Module) -> list[str]:
    for stmt in server_args.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in stmt.targets
        ):
            return [_name(e) for e in stmt.value.elts]  # type: ignore[attr-defined]
    raise AssertionError("srt/server_args.py defines no _INPUT_NAMESPACES list")


def _add_cli_args(server_args: ast.Module) -> ast.FunctionDef:
    for node in ast.walk(server_args):
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args":
            return node
    raise AssertionError("srt/server_args.py has no add_cli_args")


def _manual_flags(add_cli_args: ast.FunctionDef) -> Iterator[tuple[list[str], Nargs]]:
    """Each literal ``parser.add_argument("--x", ...)`` in ``add_cli_args``."""
    for node in ast.walk(add_cli_args):
        if isinstance(node, ast.Call) and _name(node.func) == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if len(names) != len(node.args) or not names:
                raise AssertionError(f"add_argument with a computed flag name at line {node.lineno}")
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            action = _const(kw.get("action")) or _name(kw.get("action"))
            if "nargs" in kw:
                nargs: Nargs = _const(kw["nargs"])  # type: ignore[assignment]
            else:
                nargs = 0 if action in _SWITCH_ACTIONS else None
            yield names, nargs


def cli_options(src: Source) -> dict[str, Nargs]:
    """Every option string ``sglang.launch_server`` accepts, with its ``nargs``."""
    server_args = ast.parse(src.read("srt/server_args.py"))
    wanted = set(_input_namespaces(server_args))
    options: dict[str, Nargs] = {"-h": 0, "--help": 0}
    found: set[str] = set()

    def add(names: list[str], nargs: Nargs) -> None:
        for n in names:
            if n in options:
                raise AssertionError(f"flag {n} is defined twice")  # argparse would refuse too
            options[n] = nargs

    for path in src.listdir("srt/arg_groups/fields"):
        for node in ast.parse(src.read(path)).body:
            if isinstance(node, ast.ClassDef) and node.name in wanted:
                found.add(node.name)
                for names, nargs in _class_fields(node):
                    add(names, nargs)
    missing = wanted - found
    if missing:
        raise AssertionError(f"namespace classes not found in srt/arg_groups/fields: {sorted(missing)}")
    for names, nargs in _manual_flags(_add_cli_args(server_args)):
        add(names, nargs)
    return options


def mtp_architectures(src: Source) -> frozenset[str]:
    """The ``architectures[0]`` values ``ModelConfig._config_draft_model`` rewrites into a draft
    of the target's own MTP/NextN layers (``srt/configs/model_config.py``). A comparison that
    also names a speculative algorithm (``speculative_algorithm == "DSPARK"``) is a draft
    model's own architecture, not a target's, and is left out."""
    module = ast.parse(src.read("srt/configs/model_config.py"))
    consts: dict[str, list[str]] = {}
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            values = _strings(stmt.value)
            if values:
                consts[stmt.targets[0].id] = values
    func = next(
        n for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == "_config_draft_model"
    )
    archs: set[str] = set()
    for test in (n.test for n in ast.walk(func) if isinstance(n, ast.If)):
        parts = test.values if isinstance(test, ast.BoolOp) else [test]
        if any("speculative_algorithm" in ast.unparse(p) for p in parts):
            continue
        for part in parts:
            if not (isinstance(part, ast.Compare) and len(part.ops) == 1):
                continue
            if ast.unparse(part.left) != "self.hf_config.architectures[0]":
                continue
            right = part.comparators[0]
            if isinstance(part.ops[0], ast.Eq) and isinstance(_const(right), str):
                archs.add(right.value)  # type: ignore[attr-defined]
            elif isinstance(part.ops[0], ast.In):
                archs.update(_strings(right) or consts.get(_name(right), []))
    return frozenset(archs)


def reasoning_parsers(src: Source) -> frozenset[str]:
    """The choices of ``--reasoning-parser``: ``auto`` and ``REASONING_PARSER_NAMES``
    (``srt/parser/reasoning_parser_names.py``, which ``server_args.py`` offers)."""
    module = ast.parse(src.read("srt/parser/reasoning_parser_names.py"))
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and ast.unparse(stmt.targets[0]) == "REASONING_PARSER_NAMES":
            return frozenset(["auto", *_strings(stmt.value)])
    raise AssertionError("no REASONING_PARSER_NAMES in srt/parser/reasoning_parser_names.py")


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _is_flag(arg: str) -> bool:
    return arg.startswith("-") and not _NUMBER.match(arg)


def parse_args(args: Sequence[str], options: Mapping[str, Nargs]) -> tuple[dict[str, list[str]], list[str]]:
    """``args`` (what follows ``sglang.launch_server``) parsed the way the release's argparse
    would, except that every flag must be spelled exactly: 0.5.23's parser allows abbreviations,
    so a flag it no longer defines can still be taken as a prefix of one it does (or fail as an
    ambiguous one, like ``--cuda-graph-max-bs``). Returns the values of each flag (the last
    occurrence) and the problems found, each naming the flag."""
    values: dict[str, list[str]] = {}
    problems: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not _is_flag(arg):
            problems.append(f"{arg!r}: a value that follows no flag expecting one")
            continue
        name, eq, inline = arg.partition("=")
        if name not in options:
            near = sorted(o for o in options if o.startswith(name))
            hint = f" (argparse would read it as an abbreviation of {' or '.join(near)})" if near else ""
            problems.append(f"{name}: no such flag{hint}")
            while i < len(args) and not _is_flag(args[i]):
                i += 1
            continue
        nargs = options[name]
        got = [inline] if eq else []
        if nargs == 0:
            if eq:
                problems.append(f"{name}: a switch, given the value {inline!r}")
        elif not eq:
            most = {None: 1, "?": 1}.get(nargs, len(args)) if not isinstance(nargs, int) else nargs
            while i < len(args) and len(got) < most and not _is_flag(args[i]):
                got.append(args[i])
                i += 1
            least = nargs if isinstance(nargs, int) else {None: 1, "+": 1}.get(nargs, 0)
            if len(got) < least:
                problems.append(
                    f"{name}: expects {'a value' if nargs is None else f'nargs={nargs!r}'}, got none"
                )
        values[name] = got
    return values, problems


def spec_metric_keys(src: Source) -> frozenset[str]:
    """The per-request ``spec_*`` keys SGLang reads back from ``meta_info``: the ``metric_keys``
    tuple of ``spec_tokens_details_from_meta_info`` (``srt/entrypoints/openai/utils.py``)."""
    tree = ast.parse(src.read("srt/entrypoints/openai/utils.py"))
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == "spec_tokens_details_from_meta_info":
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and any(_name(t) == "metric_keys" for t in node.targets):
                    return frozenset(_strings(node.value))
    raise AssertionError("spec_tokens_details_from_meta_info's metric_keys not found in the wheel")
