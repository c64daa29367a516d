"""The command lines a node runs: one SGLang server (or simulator) and one bound worker per GPU.

Pure functions, no I/O: :func:`plan_node` turns the node's options into one :class:`GpuPlan`
per GPU, each with the argv and environment of its server and of its worker. The SGLang flags
are those of the pinned release (:mod:`workers.node.sglang_release`): the speculative decoding
of the model's profile (:mod:`workers.node.profiles`: NEXTN on a model's own MTP layers, EAGLE3
with a draft model, or none), and ``--max-running-requests`` / ``--cuda-graph-max-bs-decode``
raised to the worker's in-flight target, so the worker never queues requests the server will
not batch, and ``--stream-interval`` (the workers read their answers as streams). A flag the user
passes (``--sglang-arg``) replaces ours.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.settings import DEFAULT_INFLIGHT_CEILING, DEFAULT_MAX_INFLIGHT
from workers.node.profiles import FlagPair, Profile, SpecDecode, choose_profile

HOST = "127.0.0.1"
HEALTH_PATH = "/health_generate"
REASONING_PARSER = "qwen3"
#: ``--stream-interval``: a streamed answer's chunk goes out once this many tokens are unsent (the
#: release's default is 1, a chunk per decode step; fewer chunks cost the server and the worker
#: less: docs/performance.md, "Streaming"). The loop detector checks every 64 characters anyway,
#: about 15 tokens.
STREAM_INTERVAL = 16
#: No speculative decoding (a dense model without a draft).
NO_SPEC = Profile("none", "no speculative decoding")


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """Everything :func:`plan_node` needs; ``python`` is the interpreter of the children."""

    gpus: tuple[int, ...]
    model_path: str
    port_base: int = 30000
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    #: ``--max-inflight auto``: each worker tunes its target below the servers' cap.
    tune_inflight: bool = False
    inflight_ceiling: int = DEFAULT_INFLIGHT_CEILING
    sglang_args: tuple[str, ...] = ()
    simulate: bool = False
    sim_args: tuple[str, ...] = ()
    python: str = "python"
    sglang_python: str = ""
    #: Worker on GPU N serves Prometheus metrics on ``metrics_port_base + N``; 0 = off.
    metrics_port_base: int = 0
    #: The model's parsed ``config.json``; None when there is no local one (a hub id).
    model_config: Mapping[str, Any] | None = None
    #: A draft model for EAGLE3 (for a model without MTP layers); "" = none.
    draft_model: str = ""


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """One GPU: its server and its worker, both with ``CUDA_VISIBLE_DEVICES`` set to the GPU."""

    gpu: int
    name: str
    port: int
    endpoint: str
    server_argv: tuple[str, ...]
    worker_argv: tuple[str, ...]
    env: Mapping[str, str]

    @property
    def health_url(self) -> str:
        return self.endpoint + HEALTH_PATH


_RANGE = re.compile(r"^(\d+)-(\d+)$")


def parse_gpus(spec: str) -> tuple[int, ...]:
    """``"0-6"``, ``"0,2,5"``, ``"0-3,6"`` or ``"4"`` → sorted distinct GPU indices.

    Raises :class:`ConfigError` naming the bad part for anything else (empty, negative,
    reversed ranges, duplicates, words).
    """
    text = spec.strip()
    if not text:
        raise ConfigError("--gpus is required, e.g. --gpus 0-6 or --gpus 0,2,5")
    gpus: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        match = _RANGE.match(part)
        if match:
            first, last = int(match.group(1)), int(match.group(2))
            if first > last:
                raise ConfigError(f"--gpus {spec!r}: range {part!r} runs backwards (write {last}-{first})")
            gpus.extend(range(first, last + 1))
        elif part.isdigit():
            gpus.append(int(part))
        else:
            raise ConfigError(
                f"--gpus {spec!r}: {part!r} is not a GPU index or a range (examples: 0-6, 0,2,5, 0-3,6)"
            )
    dupes = sorted({g for g in gpus if gpus.count(g) > 1})
    if dupes:
        raise ConfigError(f"--gpus {spec!r}: GPU {', '.join(map(str, dupes))} listed twice")
    return tuple(sorted(gpus))


def split_args(values: Sequence[str]) -> tuple[str, ...]:
    """Each value shell-split: ``["--mem-fraction-static 0.85", "--context-length=40960"]`` → 3 args."""
    out: list[str] = []
    for value in values:
        try:
            out.extend(shlex.split(value))
        except ValueError as exc:
            raise ConfigError(f"cannot split {value!r} into arguments: {exc}") from None
    return tuple(out)


def _flag_name(arg: str) -> str | None:
    """``--x`` for ``--x`` and ``--x=value``; None for a value."""
    return arg.split("=", 1)[0] if arg.startswith("--") else None


#: Every flag the launcher itself may give a server: a user's flag replaces ours only when spelled
#: the same way, so an abbreviation of one of these is refused (:func:`check_user_flags`).
LAUNCHER_FLAGS = frozenset(
    {
        "--model-path",
        "--host",
        "--port",
        "--reasoning-parser",
        "--max-running-requests",
        "--cuda-graph-max-bs-decode",
        "--enable-metrics",
        "--stream-interval",
        *(flag for flag, _ in SpecDecode("EAGLE3", draft_model_path="x").flag_pairs()),
    }
)


def check_user_flags(user: Sequence[str], ours: frozenset[str] = LAUNCHER_FLAGS) -> None:
    """Refuse a user flag that abbreviates one of ours (``--speculative-algo``).

    SGLang's argparse reads an unambiguous prefix as the full flag, so the server would get both
    ours and the user's and the launcher could not tell that the user's replaces ours (or, for
    ``--speculative-algorithm``, that the user chose speculation). Raises :class:`ConfigError`
    naming the flag and its full spelling.
    """
    for arg in user:
        name = _flag_name(arg)
        if name is None or name in ours or len(name) <= 2:
            continue
        full = sorted(flag for flag in ours if flag.startswith(name))
        if full:
            raise ConfigError(
                f"--sglang-arg {arg!r}: {name} abbreviates {' or '.join(full)}, which the launcher "
                "also sets; spell it in full so that yours replaces the launcher's"
            )


def merge_flags(ours: Sequence[FlagPair], user: Sequence[str]) -> list[str]:
    """Our flags, less every one the user also gives, then the user's args as given: each flag
    appears once, and the user's value is the one SGLang sees."""
    given = {name for arg in user if (name := _flag_name(arg))}
    out = [part for flag, values in ours if flag not in given for part in (flag, *values)]
    return [*out, *user]


@dataclass(frozen=True, slots=True)
class ServerCap:
    """The running-request cap every server gets, and why (``--print-commands`` says it)."""

    value: int
    why: str


def server_cap(options: NodeOptions) -> ServerCap:
    """``--max-running-requests`` and ``--cuda-graph-max-bs-decode`` for each server: the fixed
    target; under ``--max-inflight auto`` the tuner's ceiling, or the user's own
    ``--max-running-requests`` (a user's flag always replaces ours on the command line)."""
    if not options.tune_inflight:
        return ServerCap(options.max_inflight, "the fixed in-flight target (--max-inflight)")
    user = _user_value(options.sglang_args, "--max-running-requests")
    if user is not None:
        try:
            value = int(user)
        except ValueError:
            raise ConfigError(f"--sglang-arg --max-running-requests {user!r} is not a number") from None
        return ServerCap(value, "your --sglang-arg --max-running-requests")
    return ServerCap(
        options.inflight_ceiling,
        "the in-flight tuner's ceiling (--inflight-ceiling): each worker tunes its target below it",
    )


def _user_value(args: Sequence[str], flag: str) -> str | None:
    """The value the user's args give ``flag`` (the last one wins, as in argparse), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def inflight_summary(options: NodeOptions) -> str:
    """One line: what each worker keeps in flight and each server's cap, with the reason."""
    cap = server_cap(options)
    if options.tune_inflight:
        start = min(options.max_inflight, cap.value)
        kept = f"tuned per GPU from {start}, at most {cap.value}"
    else:
        kept = f"{options.max_inflight} fixed"
    return f"in flight: {kept}; servers capped at {cap.value} running requests ({cap.why})"


def sglang_command(
    python: str,
    model_path: str,
    port: int,
    max_inflight: int,
    extra: Sequence[str] = (),
    profile: Profile = NO_SPEC,
) -> list[str]:
    """``python -m sglang.launch_server`` for one GPU: the profile's speculative decoding, the
    in-flight cap, the stream interval, then ``extra`` (the user's flags, which replace ours)."""
    cap = str(max_inflight)
    ours: list[FlagPair] = [
        ("--model-path", (model_path,)),
        ("--host", (HOST,)),
        ("--port", (str(port),)),
        ("--reasoning-parser", (REASONING_PARSER,)),
        *profile.flags,
        ("--max-running-requests", (cap,)),
        ("--cuda-graph-max-bs-decode", (cap,)),
        ("--enable-metrics", ()),
        ("--stream-interval", (str(STREAM_INTERVAL),)),
    ]
    return [python, "-m", "sglang.launch_server", *merge_flags(ours, extra)]


def node_profile(options: NodeOptions) -> Profile:
    """The speculative-decoding profile every server of this node gets; raises
    :class:`ConfigError` for a user flag that abbreviates one of the launcher's."""
    check_user_flags(options.sglang_args)
    return choose_profile(options.model_path, options.model_config, options.draft_model, options.sglang_args)


def sim_command(
    python: str, model_path: str, port: int, max_inflight: int, extra: Sequence[str] = ()
) -> list[str]:
    """The simulator in place of SGLang: same port, same running-request cap."""
    model = ["--model", model_path] if model_path else []
    return [
        python,
        "-m",
        "dflash_tasks.sim",
        "--host",
        HOST,
        "--port",
        str(port),
        "--max-running-requests",
        str(max_inflight),
        *model,
        *extra,
    ]


def worker_command(
    python: str, endpoint: str, name: str, max_inflight: int, ceiling: int | None = None
) -> list[str]:
    """``python -m workers`` bound to one server: a fixed target, or (``ceiling`` given) the tuner
    starting from ``max_inflight`` below the server's cap."""
    inflight = [str(max_inflight)] if ceiling is None else ["auto", "--inflight-ceiling", str(ceiling)]
    return [python, "-m", "workers", "--endpoint", endpoint, "--name", name, "--max-inflight", *inflight]


def child_env(base: Mapping[str, str], gpu: int, metrics_port_base: int = 0) -> dict[str, str]:
    """``base`` with the GPU pinned, unbuffered Python output (logs arrive line by line) and,
    when metrics are on, the worker's own Prometheus port (one per worker on a machine)."""
    env = {**base, "CUDA_VISIBLE_DEVICES": str(gpu), "PYTHONUNBUFFERED": "1"}
    if metrics_port_base > 0:
        env["DFLASH_METRICS_PORT"] = str(metrics_port_base + gpu)
    return env


def plan_node(options: NodeOptions, base_env: Mapping[str, str]) -> list[GpuPlan]:
    """One plan per GPU; GPU ``N`` listens on ``port_base + N`` and its worker is named ``gpuN``."""
    if not options.gpus:
        raise ConfigError("--gpus names no GPU")
    if options.max_inflight < 1:
        raise ConfigError(f"--max-inflight must be >= 1, got {options.max_inflight}")
    if not options.simulate and not options.model_path:
        raise ConfigError("--model is required (a model directory, ideally staged in /dev/shm)")
    top = options.port_base + max(options.gpus)
    if options.port_base < 1 or top > 65535:
        raise ConfigError(f"--port-base {options.port_base}: GPU {max(options.gpus)} would get port {top}")
    if options.metrics_port_base > 0 and options.metrics_port_base + max(options.gpus) > 65535:
        raise ConfigError(f"metrics port {options.metrics_port_base} + GPU {max(options.gpus)} is past 65535")
    profile = NO_SPEC if options.simulate else node_profile(options)
    cap = server_cap(options)
    if cap.value < 1:
        raise ConfigError(f"the servers' running-request cap must be >= 1, got {cap.value}")
    plans = []
    for gpu in options.gpus:
        port = options.port_base + gpu
        endpoint = f"http://{HOST}:{port}"
        if options.simulate:
            server = sim_command(options.python, options.model_path, port, cap.value, options.sim_args)
        else:
            server = sglang_command(
                options.sglang_python or options.python,
                options.model_path,
                port,
                cap.value,
                options.sglang_args,
                profile,
            )
        name = f"gpu{gpu}"
        ceiling = cap.value if options.tune_inflight else None
        worker = worker_command(options.python, endpoint, name, options.max_inflight, ceiling)
        env = child_env(base_env, gpu, options.metrics_port_base)
        plans.append(GpuPlan(gpu, name, port, endpoint, tuple(server), tuple(worker), env))
    return plans
