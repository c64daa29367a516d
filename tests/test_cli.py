"""The commands' one convention: every command a console script running the same ``main`` as its
``python -m`` form, every settings flag accepting what its ``DFLASH_*`` variable accepts, old
spellings kept as hidden aliases, and exit statuses named in one place and documented."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest

from dflash_tasks.cli.commands import COMMANDS
from dflash_tasks.cli.flags import SettingType, load_settings
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.settings import (
    CommonSettings,
    MonitorSettings,
    NodeSettings,
    ProducerSettings,
    WorkerSettings,
)
from tests.helpers import REPO

SCRIPTS: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def python_m_module(module: str) -> str:
    """The module ``python -m module`` runs: the module itself, or a package's ``__main__``."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, module
    return f"{module}.__main__" if spec.submodule_search_locations is not None else module


def entry_main(entry: str) -> Callable[..., int]:
    module, _, name = entry.partition(":")
    main: Callable[..., int] = getattr(importlib.import_module(module), name)
    return main


# --- console scripts ------------------------------------------------------------------------------


def test_pyproject_has_a_console_script_for_every_command_of_the_table() -> None:
    assert set(SCRIPTS) == set(COMMANDS)
    for script, module in COMMANDS.items():
        assert SCRIPTS[script] == f"{python_m_module(module)}:main", script


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_a_console_script_and_its_python_m_form_run_one_main(script: str) -> None:
    runs = importlib.import_module(python_m_module(COMMANDS[script]))
    assert entry_main(SCRIPTS[script]) is runs.main


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_every_console_script_answers_help_under_its_own_name(script: str) -> None:
    module, _, name = SCRIPTS[script].partition(":")
    # What the installed script does: import the entry point and call it, argv[0] its name.
    code = f"import sys; sys.argv[0] = {script!r}; from {module} import {name}; sys.exit({name}())"
    done = subprocess.run(
        [sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script} "), done.stdout[:200]


def test_the_installed_console_scripts_answer_help() -> None:
    bin_dir = Path(sys.executable).parent
    missing = [script for script in COMMANDS if not (bin_dir / script).exists()]
    if missing:
        pytest.skip(f"console scripts not installed in {bin_dir} (make venv installs them): {missing}")
    for script in COMMANDS:
        done = subprocess.run([str(bin_dir / script), "--help"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.startswith(f"usage: {script} "), (script, done.stderr)


# --- a flag and its variable ----------------------------------------------------------------------

#: (module, the role its command loads, the flags its parser requires).
PARSERS: list[tuple[str, type[CommonSettings], list[str]]] = [
    ("dflash_tasks.producer.enqueue_args", ProducerSettings, ["--input", "p.jsonl", "--output", "o"]),
    ("dflash_tasks.producer.resume", ProducerSettings, ["--output", "o"]),
    ("dflash_tasks.monitoring.status", MonitorSettings, ["--output", "o"]),
    ("dflash_tasks.monitoring.page.command", MonitorSettings, ["--output", "o"]),
    ("dflash_tasks.monitoring.flower", MonitorSettings, []),
    ("dflash_tasks.output.verify", CommonSettings, ["--input", "p.jsonl", "--output", "o"]),
    ("dflash_tasks.output.report", CommonSettings, ["--output", "o"]),
    ("dflash_tasks.output.export", CommonSettings, ["--output", "o", "--to", "t.jsonl"]),
    ("workers.__main__", WorkerSettings, []),
    ("workers.node.main", NodeSettings, []),
]
#: Texts tried on every settings flag and its variable: numbers, words, URLs, the odd ones.
VALUES = ["0", "1", "7", "-1", "2.5", "1e3", "inf", "nan", "auto", " AUTO ", "true", "off", "abc"]
VALUES += ["all", "none", "workers", "http://127.0.0.1:1", "redis://h:1/0", "x y", "u:p"]


def setting_actions(parser: argparse.ArgumentParser, role: type[CommonSettings]) -> list[argparse.Action]:
    """The flags that set one of ``role``'s settings (their ``dest`` is its field), aliases aside."""
    names = {f.name for f in fields(role)}
    return [a for a in parser._actions if a.dest in names and a.help != argparse.SUPPRESS]


def parse_quietly(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | None:
    try:
        return parser.parse_args(argv)
    except SystemExit:
        return None


def from_flags(role: type[CommonSettings], args: argparse.Namespace) -> CommonSettings | None:
    try:
        return load_settings(role, args)
    except ConfigError:
        return None


def from_variable(role: type[CommonSettings], variable: str, text: str) -> CommonSettings | None:
    try:
        return role.load({variable: text})
    except ConfigError:
        return None


@pytest.mark.parametrize(("module", "role", "required"), PARSERS, ids=[p[0] for p in PARSERS])
def test_every_settings_flag_is_a_setting_of_the_role_its_command_loads(
    module: str, role: type[CommonSettings], required: list[str]
) -> None:
    parser = importlib.import_module(module).build_parser()
    names = {f.name for f in fields(role)}
    parsed_as_settings = [a for a in parser._actions if isinstance(a.type, SettingType)]
    for action in parsed_as_settings:  # else load_settings would drop it silently
        assert action.dest in names, f"{module} {action.option_strings}: {role.__name__} has no {action.dest}"
    actions = setting_actions(parser, role)
    assert actions, f"{module}: no flag goes through the settings"
    for action in actions:  # parsed as its variable is, and says which variable
        assert isinstance(action.type, SettingType), f"{module} {action.option_strings}"
        assert f"[DFLASH_{action.dest.upper()}]" in (action.help or ""), action.option_strings


@pytest.mark.parametrize(("module", "role", "required"), PARSERS, ids=[p[0] for p in PARSERS])
def test_a_flag_and_its_variable_accept_the_same_values(
    module: str, role: type[CommonSettings], required: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = importlib.import_module(module).build_parser()
    for action in setting_actions(parser, role):
        flag, variable = action.option_strings[0], f"DFLASH_{action.dest.upper()}"
        default = next((f.default for f in fields(role) if f.name == action.dest), None)
        accepted = 0
        for text in [*VALUES, str(default)]:  # the default's own text: at least one value both accept
            args = parse_quietly(parser, [*required, f"{flag}={text}"])
            by_flag = None if args is None else from_flags(role, args)
            assert by_flag == from_variable(role, variable, text), f"{module} {flag}={text!r} / {variable}"
            accepted += by_flag is not None
        assert accepted, f"{module} {flag}: no value tried was accepted, so nothing was compared"
    capsys.readouterr()


def test_a_flag_beats_its_variable_and_the_variable_fills_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_MAX_FAILURES", "9")
    monkeypatch.setenv("DFLASH_HEALTH_INTERVAL_SECONDS", "7")
    monkeypatch.setenv("DFLASH_HANG_RESTART_SECONDS", "8")
    parser = importlib.import_module("workers.node.main").build_parser()
    args = parser.parse_args(["--max-failures", "3", "--health-interval-seconds", "0.5"])
    loaded = load_settings(NodeSettings, args)
    assert (loaded.max_failures, loaded.health_interval_seconds, loaded.hang_restart_seconds) == (3, 0.5, 8.0)


# --- old spellings --------------------------------------------------------------------------------

NODE, PAGE, FLOWER = (
    "workers.node.main",
    "dflash_tasks.monitoring.page.command",
    "dflash_tasks.monitoring.flower",
)
ENQUEUE, DEMO = "dflash_tasks.producer.enqueue_args", "dflash_tasks.demo.run"
#: (module, old spelling, new spelling): the old one is accepted as the new one and not shown.
ALIASES = [
    (NODE, "--health-interval", "--health-interval-seconds"),
    (NODE, "--restart-delay", "--restart-delay-seconds"),
    (NODE, "--hang-restart", "--hang-restart-seconds"),
    (NODE, "--server-start-timeout", "--server-start-timeout-seconds"),
    (NODE, "--worker-stop-timeout", "--worker-stop-timeout-seconds"),
    (NODE, "--server-stop-timeout", "--server-stop-timeout-seconds"),
    (PAGE, "--refresh", "--refresh-seconds"),
    (FLOWER, "--purge-offline-workers", "--purge-offline-seconds"),
    (ENQUEUE, "--preflight-timeout", "--preflight-timeout-seconds"),
    (ENQUEUE, "--replan-seconds", "--wait-replan-seconds"),
    (DEMO, "--stop-timeout", "--stop-timeout-seconds"),
    (DEMO, "--out", "--output"),
]
REQUIRED = {PAGE: ["--output", "o"], ENQUEUE: ["--input", "p", "--output", "o"]}


@pytest.mark.parametrize(("module", "old", "new"), ALIASES, ids=[a[1] for a in ALIASES])
def test_an_old_spelling_still_works_and_is_not_shown(
    module: str, old: str, new: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = importlib.import_module(module).build_parser()
    required = REQUIRED.get(module, [])
    (action,) = [a for a in parser._actions if new in a.option_strings]
    by_old, by_new = (vars(parser.parse_args([*required, flag, "9"])) for flag in (old, new))
    assert by_old[action.dest] == by_new[action.dest] is not None
    assert by_old == by_new
    assert f"{old} " not in parser.format_help() and f"{new} " in parser.format_help()
    capsys.readouterr()


def test_the_demo_says_out_is_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    importlib.import_module("dflash_tasks.demo.run").build_parser().parse_args(["--out", "d"])
    assert "--out is deprecated; use --output" in capsys.readouterr().err


@pytest.mark.parametrize("script", sorted(set(COMMANDS) - {"dflash-sim", "dflash-demo"}))
def test_every_command_spells_the_store_broker_and_durations_one_way(script: str) -> None:
    main = entry_main(SCRIPTS[script])
    parser = importlib.import_module(main.__module__).build_parser()
    shown = {s for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}
    if "--output" in shown:  # reads a job's store
        assert "--s3-endpoint-url" in shown, script
    if script not in {"dflash-verify", "dflash-report", "dflash-export"}:  # the store only
        assert {"--broker-url", "--queue"} <= shown, script
    durations = {f for f in shown if f.endswith(("-timeout", "-interval", "-delay", "-restart", "-refresh"))}
    assert not durations, (script, durations)  # a duration says -seconds


# --- exit statuses --------------------------------------------------------------------------------


def test_every_exit_status_is_documented_in_usage() -> None:
    usage = (REPO / "docs" / "usage.md").read_text()
    section = usage.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    for code in ExitCode:
        assert f"| {code.value} | `{code.name}` |" in section, code


@pytest.mark.parametrize("script", sorted(COMMANDS))
def test_no_command_returns_a_bare_number(script: str) -> None:
    main = entry_main(SCRIPTS[script])
    tree = ast.parse(Path(inspect.getsourcefile(main) or "").read_text())
    literals = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Return)
        and isinstance(node.value, ast.Constant)
        and type(node.value.value) is int  # a bool is no exit status
    ]
    assert not literals, f"{script}: return a core.exit_codes.ExitCode, not a number (lines {literals})"


def test_a_command_exits_with_error_on_a_missing_job_or_a_bad_flag(tmp_path: Path) -> None:
    from dflash_tasks.output.report import main as report_main
    from dflash_tasks.output.verify import main as verify_main

    assert report_main(["--output", str(tmp_path / "nothing")]) == ExitCode.ERROR == 2
    assert verify_main(["--input", str(tmp_path / "p.jsonl"), "--output", str(tmp_path)]) == ExitCode.ERROR
    with pytest.raises(SystemExit) as stop:
        importlib.import_module("workers.node.main").main(["--max-failures", "many"])
    assert stop.value.code == ExitCode.ERROR
