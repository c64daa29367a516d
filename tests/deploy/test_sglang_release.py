"""The pinned SGLang release: named the same everywhere, and every launch line we ship or
document uses only flags that release defines, spelled exactly, with the values they take.

SGLang's flags come from the release's own wheel (tests/sglang_wheel.py downloads it without
dependencies; tests/sglang_cli.py reads its argument definitions with ``ast``), never from a
list typed here. A wheel that cannot be had fails these tests; it never skips them.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dflash_tasks.sim.protocol import spec_details
from tests.deploy.test_compose import SERVICES, argv, interpolate
from tests.model_configs import DEEPSEEK_V3, QWEN3_8B, QWEN3_30B_A3B, QWEN36_27B
from tests.sglang_cli import (
    Nargs,
    cli_options,
    mtp_architectures,
    parse_args,
    reasoning_parsers,
    spec_metric_keys,
)
from tests.sglang_wheel import SglangSource, WheelUnavailable, ensure_wheel, wheel_name
from workers.node.launch import LAUNCHER_FLAGS, NodeOptions, plan_node, split_args
from workers.node.profiles import MTP_ARCHITECTURES, NEXTN
from workers.node.sglang_release import LAST_CUDA12_IMAGE, SGLANG_IMAGE, SGLANG_PIP_SPEC, SGLANG_VERSION
from workers.sglang_client import MetaInfo

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DEPLOY_FILES = sorted(p for p in (REPO / "deploy").rglob("*") if p.is_file())


@dataclass(frozen=True)
class Release:
    options: Mapping[str, Nargs]
    parsers: frozenset[str]
    mtp_architectures: frozenset[str]

    def problems(self, args: Sequence[str], where: str) -> list[str]:
        values, problems = parse_args(args, self.options)
        parser = values.get("--reasoning-parser")
        if parser and parser[0] not in self.parsers and not parser[0].startswith("<"):
            problems.append(f"--reasoning-parser {parser[0]}: not a parser of SGLang {SGLANG_VERSION}")
        return [f"{where}: {p}" for p in problems]


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The pinned release's wheel, downloaded once; a wheel that cannot be had fails the test."""
    problem = ""
    try:
        return ensure_wheel()
    except WheelUnavailable as exc:
        problem = str(exc)
    pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="module")
def release(wheel: Path) -> Iterator[Release]:
    src = SglangSource(wheel)
    try:
        yield Release(cli_options(src), reasoning_parsers(src), mtp_architectures(src))
    finally:
        src.close()


# --- the wheel and what is read from it ------------------------------------------------------------


def test_the_wheel_is_the_pinned_release(wheel: Path) -> None:
    assert wheel.name == wheel_name() and wheel.name.startswith(f"sglang-{SGLANG_VERSION}-")
    with zipfile.ZipFile(wheel) as whl:
        metadata = whl.read(f"sglang-{SGLANG_VERSION}.dist-info/METADATA").decode()
    assert f"\nVersion: {SGLANG_VERSION}\n" in metadata


def test_flags_read_from_the_wheel_follow_sglangs_own_rules(release: Release) -> None:
    opts = release.options
    assert len(opts) > 400  # every namespace field; a broken reader finds a handful
    # One flag of each rule in add_cli_args / add_cli_args_from_dataclass, with argparse's nargs:
    assert opts["--model-path"] is None  # A[str, Arg(...)] field: one value
    assert opts["--enable-metrics"] == 0  # bool field: a switch
    assert opts["--cuda-graph-bs-decode"] == "+"  # List[int] field
    assert opts["--enable-tf32-matmul"] == opts["--no-enable-tf32-matmul"] == 0  # BooleanOptionalAction
    assert opts["--reasoning-parser"] is None and opts["--config"] is None  # literal add_argument
    assert opts["--disable-cuda-graph"] == 0  # a deprecated spelling, registered by hand
    assert "--disable-cuda-graph-padding" in opts and "--help" in opts
    for flag in ("--speculative-algorithm", "--speculative-draft-model-path", "--max-running-requests"):
        assert opts[flag] is None
    # Gone in this release: as an abbreviation it is ambiguous, so every server would exit 2.
    assert "--cuda-graph-max-bs" not in opts and "--cuda-graph-bs" not in opts
    assert {"--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"} <= set(opts)
    assert {"qwen3", "deepseek-r1", "auto"} <= release.parsers


def test_the_check_fails_what_sglang_would_refuse(release: Release) -> None:
    bad = ["--cuda-graph-max-bs", "48", "--enable-metrics=yes", "--port", "--max-running", "8"]
    bad += ["--enable-metrics", "stray"]
    problems = release.problems(bad, "x")
    assert problems == [
        "x: --cuda-graph-max-bs: no such flag (argparse would read it as an abbreviation of "
        "--cuda-graph-max-bs-decode or --cuda-graph-max-bs-prefill)",
        "x: --enable-metrics: a switch, given the value 'yes'",
        "x: --port: expects a value, got none",
        "x: --max-running: no such flag (argparse would read it as an abbreviation of "
        "--max-running-requests)",
        "x: 'stray': a value that follows no flag expecting one",
    ]
    assert release.problems(["--reasoning-parser", "qwen4"], "y") == [
        "y: --reasoning-parser qwen4: not a parser of SGLang 0.5.23"
    ]
    ok = ["--cuda-graph-bs-decode", "1", "2", "4", "--speculative-eagle-topk=1", "--enable-metrics"]
    assert release.problems(ok, "z") == []


def test_our_mtp_architectures_are_the_releases(release: Release) -> None:
    assert release.mtp_architectures == MTP_ARCHITECTURES
    assert {"Qwen3_5ForConditionalGeneration", "Qwen3NextForCausalLM", "DeepseekV3ForCausalLM"} <= (
        release.mtp_architectures
    )


def test_the_spec_keys_we_read_and_simulate_are_the_releases(wheel: Path) -> None:
    """Speculative decoding cannot run on the CPU engine (tests/real_sglang), so the per-request
    ``spec_*`` keys are checked here against the release's own list."""
    src = SglangSource(wheel)
    try:
        keys = spec_metric_keys(src)
    finally:
        src.close()
    assert {"spec_verify_ct", "spec_accept_length", "spec_accept_rate"} <= keys
    ours = {name for name in MetaInfo.__slots__ if name.startswith("spec_")}
    assert ours <= keys, sorted(ours - keys)
    simulated = set(spec_details(40, 12))
    assert simulated and simulated <= keys, sorted(simulated - keys)


def test_every_flag_the_launcher_may_set_is_a_release_flag(release: Release) -> None:
    # The abbreviation check (launch.check_user_flags) compares the user's flags with these.
    assert set(LAUNCHER_FLAGS) <= set(release.options), set(LAUNCHER_FLAGS) - set(release.options)


# --- our launch lines --------------------------------------------------------------------------------

PROFILES: dict[str, dict[str, Any]] = {
    "mtp-qwen3.6": {"model_config": QWEN36_27B},
    "mtp-deepseek-v3": {"model_config": DEEPSEEK_V3},
    "dense": {"model_config": QWEN3_8B},
    "moe-without-mtp-layers": {"model_config": QWEN3_30B_A3B},
    "dense-with-draft": {"model_config": QWEN3_8B, "draft_model": "/dev/shm/models/Qwen3-8B-EAGLE3"},
    "user-speculation": {
        "model_config": QWEN36_27B,
        "sglang_args": split_args(["--speculative-algorithm NGRAM --speculative-num-draft-tokens 8"]),
    },
    "user-flags": {
        "model_config": QWEN36_27B,
        "sglang_args": split_args(["--mem-fraction-static 0.85 --context-length=40960 --api-key k"]),
    },
    "hub-id": {"model_path": "Qwen/Qwen3-8B", "model_config": None},
}


@pytest.mark.parametrize("name", PROFILES)
def test_the_node_launchers_lines_use_only_release_flags(release: Release, name: str) -> None:
    opts = NodeOptions(
        **{"gpus": (0, 3), "model_path": "/dev/shm/models/M", "max_inflight": 64, **PROFILES[name]}
    )
    for plan in plan_node(opts, {}):
        assert plan.server_argv[1:3] == ("-m", "sglang.launch_server")
        args = plan.server_argv[3:]
        assert release.problems(args, f"{name}/{plan.name}") == []
        flags = [a.split("=")[0] for a in args if a.startswith("--")]
        assert len(flags) == len(set(flags)), f"a flag twice: {args}"
        speculative = "--speculative-algorithm" in flags
        assert speculative == (name not in ("dense", "moe-without-mtp-layers", "hub-id")), args


def compose_args(service: dict[str, Any], env: Mapping[str, str] | None = None) -> list[str]:
    if env is None:
        return argv(service)
    command = service["command"]
    for key, value in env.items():  # a value set in .env: ${KEY-...} and ${KEY:-...} take it
        command = re.sub(r"\$\{" + key + r"(:?-[^}]*)?\}", value, command)
    return shlex.split(interpolate(command))


def test_compose_servers_use_only_release_flags(release: Release) -> None:
    servers = {n: s for n, s in SERVICES.items() if n.startswith("sglang-")}
    assert len(servers) == 7
    mtp = [a for flag, values in NEXTN.flag_pairs() for a in (flag, *values)]
    eagle3 = "--speculative-algorithm EAGLE3 --speculative-draft-model-path /models/D"
    for name, svc in servers.items():
        assert release.problems(compose_args(svc), name) == []
        assert " ".join(mtp) in " ".join(compose_args(svc))  # unset: the seed's MTP
        dense = compose_args(svc, {"SGLANG_SPEC_ARGS": ""})
        assert release.problems(dense, name) == [] and "--speculative-algorithm" not in dense
        drafted = compose_args(svc, {"SGLANG_SPEC_ARGS": eagle3, "DFLASH_SGLANG_ARGS": "--tp-size 1"})
        assert release.problems(drafted, name) == []
        assert drafted[drafted.index("--speculative-algorithm") + 1] == "EAGLE3"


_FENCED = re.compile(r"```[^\n]*\n(.*?)```", re.S)
_SPAN = re.compile(r"`([^`]+)`")


def code_lines(text: str, markdown: bool) -> list[str]:
    """The code of ``text`` as logical lines: backslash continuations joined; in markdown only
    fenced blocks and inline spans (a span may wrap across lines of a paragraph)."""
    if not markdown:
        return text.replace("\\\n", " ").splitlines()
    lines: list[str] = []
    for block in _FENCED.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    prose = _FENCED.sub("", text)
    lines += [" ".join(span.split()) for span in _SPAN.findall(prose)]
    return lines


def launch_snippets(text: str, markdown: bool, quoted_examples: bool = False) -> list[list[str]]:
    """The SGLang flags in ``text``: after each ``sglang.launch_server``, in each
    ``--sglang-arg '...'`` and ``*SGLANG*_ARGS=...`` value, and (``quoted_examples``, for env
    files) each quoted ``"--..."`` example in a comment."""
    found: list[list[str]] = []
    for line in code_lines(text, markdown):
        if "sglang.launch_server" in line:
            tail = line.split("sglang.launch_server", 1)[1]
            found.append(shlex.split(re.split(r"\s(?:&&|\||;|#)\s", tail)[0]))
        for m in re.finditer(r"--sglang-arg[ =](['\"])(.*?)\1", line):
            found.append(shlex.split(m.group(2)))
        for m in re.finditer(r"SGLANG\w*_ARGS=(\"[^\"]*\"|'[^']*'|\S+)", line):
            value = shlex.split(m.group(1))  # the shell's unquoting, then the program's split
            found.append(shlex.split(value[0]) if value else [])
    if quoted_examples:
        comments = " ".join(line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#"))
        found += [shlex.split(m) for m in re.findall(r"\"(--[^\"]*)\"", comments)]
    return [s for s in found if s]


def test_readme_docs_and_deploy_launch_lines_use_only_release_flags(release: Release) -> None:
    counts: dict[str, int] = {}
    for path in [*DOCS, *DEPLOY_FILES]:
        rel = str(path.relative_to(REPO))
        snippets = launch_snippets(path.read_text(), path.suffix == ".md", path.name == "env.example")
        counts[rel] = len(snippets)
        for args in snippets:
            assert release.problems(args, rel) == [], args
    # Each place we expect to show flags does: a scanner that finds nothing would pass anything.
    assert counts["README.md"] >= 1 and counts["docs/deploy.md"] >= 3, counts
    assert counts["deploy/env.example"] >= 2, counts


def test_readmes_manual_launch_line_is_the_launchers_mtp_line(release: Release) -> None:
    readme = (REPO / "README.md").read_text()
    lines = [s for s in launch_snippets(readme, markdown=True) if "--model-path" in s]
    manual = next(s for s in lines if "/dev/shm/models/Qwen3.6-27B" in s)
    plan = plan_node(NodeOptions(gpus=(0,), model_path="/m", model_config=QWEN36_27B), {})[0]
    ours = {a for a in plan.server_argv if a.startswith("--")}
    assert {a for a in manual if a.startswith("--")} - {"--host"} == ours - {"--host"}
    assert manual[manual.index("--cuda-graph-max-bs-decode") + 1] == "48"


# --- one release everywhere --------------------------------------------------------------------------


def test_install_script_installs_the_pinned_release() -> None:
    res = subprocess.run(
        ["bash", str(REPO / "deploy" / "install.sh"), "--print-sglang-spec"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.strip() == SGLANG_PIP_SPEC == f"sglang=={SGLANG_VERSION}"


def test_compose_and_env_example_pull_the_pinned_image() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["x-sglang"]["image"] == f"${{SGLANG_IMAGE:-{SGLANG_IMAGE}}}"
    assert f"lmsysorg/sglang:v{SGLANG_VERSION}" == SGLANG_IMAGE
    env = (REPO / "deploy" / "env.example").read_text()
    assert f"\nSGLANG_IMAGE={SGLANG_IMAGE}\n" in env


_RELEASE_MENTION = re.compile(r"lmsysorg/sglang:([^\s\"'`)\]}]+)|\bsglang\s*(==|>=|<=|~=|>|<)\s*([\w.]+)")


_TEXT = {".py", ".md", ".sh", ".yml", ".yaml", ".toml", ".example", ".service", ".conf", ".txt", ".cfg"}
_SKIP_DIRS = {"__pycache__", "demo-output", "test-artifacts", "logs", "build", "dist", "results"}


def project_text_files() -> Iterator[Path]:
    """The project's own text files: no hidden folders (.git, .venv, .cache), nothing generated."""
    for path in sorted(REPO.rglob("*")):
        parts = path.relative_to(REPO).parts
        if any(p.startswith(".") or p in _SKIP_DIRS or p.endswith(".egg-info") for p in parts[:-1]):
            continue
        if path.is_file() and (path.suffix in _TEXT or path.name in ("Dockerfile", "Makefile")):
            yield path


def test_no_other_sglang_release_is_named_anywhere() -> None:
    seen: dict[str, list[str]] = {}
    for path in project_text_files():
        rel = str(path.relative_to(REPO))
        # The changelog tells history; this file holds the patterns themselves.
        if rel in ("CHANGELOG.md", "tests/deploy/test_sglang_release.py"):
            continue
        for m in _RELEASE_MENTION.finditer(path.read_text(errors="replace")):
            if "{" in m.group(0):
                continue  # a template built from SGLANG_VERSION (sglang_release.py)
            seen.setdefault(rel, []).append(m.group(0))
            if m.group(1) is not None:
                # the pin, or the last CUDA 12 image that the CUDA 12 notes name (there is no
                # -cu129 image of the pin: 0.5.20 and later are CUDA 13 only)
                assert m.group(0) in (SGLANG_IMAGE, LAST_CUDA12_IMAGE), (rel, m.group(0))
            else:
                assert (m.group(2), m.group(3)) == ("==", SGLANG_VERSION), (rel, m.group(0))
    for rel in ("README.md", "docs/deploy.md", "docker-compose.yml", "deploy/env.example"):
        assert rel in seen, f"{rel} names no SGLang release"


def test_docs_name_the_pinned_release_and_the_profiles() -> None:
    readme = (REPO / "README.md").read_text()
    deploy = (REPO / "docs" / "deploy.md").read_text()
    assert SGLANG_PIP_SPEC in readme and SGLANG_PIP_SPEC in deploy
    for name in ("mtp", "eagle3", "none", "user"):  # every profile choose_profile can return
        assert f"`{name}`" in deploy
