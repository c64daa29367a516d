"""``python -m dflash_tasks.demo``: the whole pipeline on one machine, with simulated GPUs.

Writes a prompt file in every accepted format (plus a few malformed lines), builds a tiny
tokenizer that fits the simulator's words (:mod:`dflash_tasks.sim.tokenizer`, no download),
starts a node of simulated GPUs (``python -m workers.node --simulate``: one SGLang simulator
serving that model directory and one worker per GPU, which counts each sample's loss tokens with
it, supervised as on a real node), Flower and, once the job is staged, the job's page
(``python -m dflash_tasks.page``), runs ``enqueue --wait`` (live progress bar), checks the
output with ``verify``, prints the trainable yield and the cost per million trainable tokens,
and stops everything it started, on Ctrl-C too.
Redis must already answer at ``DFLASH_BROKER_URL`` (``make demo`` sees to it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from dflash_tasks.core.errors import DflashError, RetryableError
from dflash_tasks.core.setting_values import redact_url
from dflash_tasks.core.settings import MonitorSettings
from dflash_tasks.monitoring.live_yield import describe_yield
from dflash_tasks.producer.inputs import InvalidLine
from dflash_tasks.producer.mix import read_input
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from workers.node.main import port_in_use
from workers.node.procs import Child, stop_all

MODEL = "Qwen/Qwen3-8B"
FLOWER_USER = "admin"
_NODE_READY = re.compile(r"node ready: (\d+) GPU")


class Children:
    """What the demo started: the node, Flower, and the enqueue and verify commands in turn."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[Child] = []

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str]) -> Child:
        child = Child(name, tuple(argv), env, self.logs / f"{name}.log")
        child.spawn()
        self.started.append(child)
        return child

    def foreground(self, argv: Sequence[str]) -> int:
        """Run ``argv`` on our terminal (its progress bar shows live) and return its exit status."""
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()

    def stop_all(self, timeout: float) -> None:
        """Flower, then the node (which stops its workers before its simulators)."""
        for child in reversed(self.started):
            try:
                stop_all([child], timeout, lambda: False, _say)
            except KeyboardInterrupt:
                child.signal(signal.SIGKILL)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_for_log(child: Child, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
    """Wait until ``child``'s log matches ``pattern``; raise DemoError if it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        found = pattern.search(child.log_path.read_text(errors="replace"))
        if found:
            return found
        if not child.running():
            raise DemoError(f"{child.name} exited with status {child.exit_code()}:\n{_tail(child.log_path)}")
        if time.monotonic() > deadline:
            raise DemoError(f"{child.name} not ready after {timeout:.0f}s (log: {child.log_path})")
        time.sleep(0.1)


class DemoError(Exception):
    """The demo cannot go on; the message says why."""


class Terminated(Exception):
    """SIGTERM or SIGHUP arrived."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signal.Signals(signum).name)


# --- the prompt file ---------------------------------------------------------------------------

_TOPICS = (
    "binary search",
    "the CAP theorem",
    "photosynthesis",
    "TCP congestion control",
    "Bayes' rule",
    "the Fourier transform",
    "garbage collection",
    "plate tectonics",
    "public-key cryptography",
    "the halting problem",
    "supply and demand",
    "CRISPR",
    "gradient descent",
    "black holes",
    "consistent hashing",
    "the French Revolution",
    "eigenvalues",
    "Raft consensus",
    "enzymes",
)
_ASKS = (
    "Explain {t} to a first-year student, step by step.",
    "What is a common misconception about {t}? Reason it through.",
    "Write three exam questions about {t}, each with a worked answer.",
    "Compare {t} with a related idea and say when each applies.",
    "Summarize {t} in five bullet points, then give one example.",
)
_SYSTEM = "You are a careful assistant. Think before you answer."


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(12, 999), rng.randint(12, 999), rng.randint(2, 99)
    return f"Compute ({a} * {b}) mod {c} and show your reasoning."


def _question(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return _math(rng)
    return rng.choice(_ASKS).format(t=rng.choice(_TOPICS))


def _record(i: int, tag: str, rng: random.Random) -> dict[str, Any]:
    """One well-formed line; the format cycles through every accepted shape."""
    q = _question(rng)
    sid = f"demo-{tag}-{i:06d}"
    kind = i % 6
    if kind == 0:
        return {
            "id": sid,
            "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": q}],
        }
    if kind == 1:
        parts = [{"type": "text", "text": q}, {"type": "text", "text": "Keep it short."}]
        return {"id": sid, "messages": [{"role": "user", "content": parts}]}
    if kind == 2:
        turns = [
            {"from": "human", "value": _question(rng)},
            {"from": "gpt", "value": "(an earlier answer)"},
            {"from": "human", "value": q},
            {"from": "gpt", "value": "(the answer to regenerate)"},
        ]
        return {"id": sid, "conversations": turns}
    if kind == 3:
        return {"id": sid, "conversations": [{"role": "user", "content": q}]}
    if kind == 4:
        return {"id": i, "prompt": q}  # an integer id
    return {"prompt": f"[{tag}] {q}"}  # no id: named after its line


_MALFORMED = (
    '{"prompt": "an unterminated line',
    "[1, 2, 3]",
    "{}",
    '{"prompt": 42}',
    '{"messages": []}',
    '{"messages": [{"role": "assistant", "content": "only an answer"}]}',
    '{"conversations": [{"from": "human"}]}',
    '{"messages": [{"role": "wizard", "content": "an unknown role"}]}',
)


def write_prompts(path: Path, count: int, seed: int) -> tuple[int, int]:
    """Write ``count`` valid prompts with the malformed lines spread among them.

    Every run gets a fresh tag in its ids, so the file (and so the job) is new each time.
    Returns (valid, invalid) as counted by the real reader.
    """
    rng = random.Random(seed)
    tag = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(2)}"
    lines = [json.dumps(_record(i, tag, rng)) for i in range(count)]
    dup = next(line for line in lines if '"id": "demo-' in line)
    extra = [*_MALFORMED, dup]  # a duplicate id
    for bad in extra:
        lines.insert(rng.randint(0, len(lines)), bad)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    invalid = sum(1 for item in read_input(path) if isinstance(item, InvalidLine))
    return len(lines) - invalid, invalid


# --- the demo ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _free_port_range(count: int) -> int:
    """A base port B with B .. B+count-1 all free on 127.0.0.1."""
    for _ in range(100):
        base = _free_port()
        if base + count < 65536 and all(not port_in_use(base + i) for i in range(count)):
            return base
    raise DemoError(f"no run of {count} free ports found on 127.0.0.1")


def _wait_port(port: int, child: Child, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and child.running():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def check_redis(url: str) -> None:
    """Raise DemoError unless Redis answers at ``url``."""
    from dflash_tasks.coord.connection import ping

    try:
        ping(url, timeout=3)
    except RetryableError as exc:
        reason = exc.__cause__ or exc  # redis-py's own words, as before
        raise DemoError(f"no Redis at {redact_url(url)} ({reason}); `make redis` starts one") from None


def _say(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Outcome:
    enqueue_status: int
    verify_status: int
    seconds: float


def run_demo(args: argparse.Namespace, children: Children) -> Outcome:
    py = sys.executable
    settings = MonitorSettings.load()
    check_redis(settings.broker_url)
    out = Path(args.out).resolve()
    prompts, completions, logs = out / "prompts.jsonl", out / "completions", out / "logs"
    shutil.rmtree(completions, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    valid, invalid = write_prompts(prompts, args.prompts, args.seed)
    _say(f"wrote {prompts}: {valid:,} prompts + {invalid} malformed lines")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    model_dir = build_model_dir(out / "model", QWEN3_TEMPLATE, MODEL.rsplit("/", 1)[-1])
    _say(f"built a tokenizer that fits the simulator's words in {model_dir} (the workers count with it)")

    port_base = _free_port_range(args.gpus)
    metrics_base = _free_port_range(args.gpus)
    sim_args = (
        f"--model-path {shlex.quote(str(model_dir))} --served-model-name {MODEL} "
        f"--time-scale {args.time_scale} --mean-output-tokens {args.mean_output_tokens} --seed {args.seed}"
    )
    node_argv = [
        py, "-m", "workers.node", "--simulate", "--gpus", f"0-{args.gpus - 1}",
        "--port-base", str(port_base),
        "--sim-arg", sim_args, "--log-dir", str(logs), "--echo", "none",
    ]  # fmt: skip
    # worker N serves Prometheus on metrics_base + N
    node = children.spawn("node", node_argv, {**env, "DFLASH_METRICS_PORT": str(metrics_base)})
    urls = [f"http://127.0.0.1:{port_base + i}" for i in range(args.gpus)]
    metrics_ports = [metrics_base + i for i in range(args.gpus)]

    flower_port = args.flower_port if not port_in_use(args.flower_port) else _free_port()
    given = settings.flower_password
    password = given or secrets.token_urlsafe(12)
    flower_env = {**env, "DFLASH_FLOWER_PASSWORD": password}  # not on the command line
    flower_argv = [py, "-m", "dflash_tasks.flower", "--port", str(flower_port)]
    flower = children.spawn("flower", flower_argv, flower_env)
    flower_url = f"http://127.0.0.1:{flower_port}"
    where = "from DFLASH_FLOWER_PASSWORD" if given else password
    wait_for_log(node, _NODE_READY, 120.0)
    _say(
        f"{args.gpus} simulated GPUs serving ({', '.join(urls)}, time scale {args.time_scale}); workers "
        f"on broker {redact_url(settings.broker_url)}, queue {settings.queue!r}; node log {node.log_path}"
    )
    if _wait_port(flower_port, flower, 20.0):
        _say(f"Flower: {flower_url}  user {FLOWER_USER}  password {where}")
    else:
        _say(f"Flower did not come up (see {logs / 'flower.log'}); going on without it")
    metrics_urls = ", ".join(f"http://127.0.0.1:{port}/metrics" for port in metrics_ports)
    _say(f"Prometheus (one per worker): {metrics_urls}")
    _say(
        "the same run on one dashboard: the node's scrape targets are in "
        f"{logs / 'prometheus-targets.json'} "
        "(file_sd); on a real run `docker compose up -d` starts Prometheus (127.0.0.1:9090) and Grafana "
        "(127.0.0.1:3000, dashboard 'dflash-tasks: the run'), and further nodes' target files go in "
        "deploy/prometheus/targets/ (docs/monitoring.md, 'Prometheus and Grafana')"
    )
    _say(f"watch from another shell: python -m dflash_tasks.status --output {completions} --watch")

    page_port = args.page_port if not port_in_use(args.page_port) else _free_port()
    threading.Thread(
        target=_start_page, args=(children, completions, page_port, settings, env), daemon=True
    ).start()

    started = time.monotonic()
    files = ["--input", str(prompts), "--output", str(completions)]
    enqueue_argv = [py, "-m", "dflash_tasks.enqueue", *files, "--model", MODEL, "--wait"]
    enqueue_argv += ["--gpu-hour-usd", str(args.gpu_hour_usd)]
    enqueue_status = children.foreground(enqueue_argv)
    seconds = time.monotonic() - started
    if enqueue_status != 0:
        _say(f"enqueue exited with status {enqueue_status}; worker logs are in {logs}")
    verify_status = children.foreground([py, "-m", "dflash_tasks.verify", *files])
    _say(f"job took {seconds:.0f}s; completions in {completions / 'outputs'}")
    _say(yield_summary(completions, args.gpu_hour_usd, args.time_scale))
    _say(f"prompts {prompts} | logs {logs} | Flower {flower_url} (user {FLOWER_USER})")
    if args.keep_running:
        _say("services keep running: press Ctrl-C to stop them")
        _watch([child for child in children.started if child.name in ("node", "flower", "page")])
    return Outcome(enqueue_status, verify_status, seconds)


def yield_summary(completions: Path, gpu_hour_usd: float, time_scale: float) -> str:
    """The job's trainable yield and cost per million trainable tokens, from its final progress.json."""
    try:
        doc = json.loads((completions / "progress.json").read_text())
    except (OSError, ValueError) as exc:
        return f"yield unknown: no progress.json ({type(exc).__name__})"
    section = doc.get("yield")
    if not section:
        return "yield not counted: no worker could read the served model's tokenizer"
    line = f"yield {describe_yield(section, int(doc['chunks']['done']))}"
    usd = section.get("usd_per_million_trainable")
    if usd is not None and time_scale > 0:
        line += (
            f" (at ${gpu_hour_usd:,.2f} per GPU-hour of the simulators, which run {1 / time_scale:,.0f}x "
            f"faster than the GPUs they model: ~${usd / time_scale:,.2f} per million at their speed)"
        )
    return line


def _start_page(
    children: Children, completions: Path, port: int, settings: MonitorSettings, env: dict[str, str]
) -> None:
    """Start the job's page once enqueue has staged the job (job.json exists) and print its address."""
    deadline = time.monotonic() + 600
    while not (completions / "job.json").exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    given = settings.page_basic_auth
    auth = given or f"{FLOWER_USER}:{secrets.token_urlsafe(12)}"
    page_env = {**env, "DFLASH_PAGE_BASIC_AUTH": auth}  # not on the command line
    argv = [sys.executable, "-m", "dflash_tasks.page", "--output", str(completions), "--port", str(port)]
    page = children.spawn("page", argv, page_env)
    user, _, password = auth.partition(":")
    shown = "from DFLASH_PAGE_BASIC_AUTH" if given else password
    if _wait_port(port, page, 20.0):
        _say(f"the job's page: http://127.0.0.1:{port}/  user {user}  password {shown}")
    else:
        _say(f"the job's page did not come up (see {page.log_path})")


def _watch(children: Sequence[Child]) -> None:
    reported: set[str] = set()
    while True:
        for child in children:
            if not child.running() and child.name not in reported:
                reported.add(child.name)
                _say(f"{child.name} exited with status {child.exit_code()} (log: {child.log_path})")
        time.sleep(1.0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dflash_tasks.demo", description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=3000, help="valid prompts to generate (default 3000)")
    p.add_argument("--gpus", type=int, default=4, help="simulated GPUs: one simulator + worker each")
    p.add_argument(
        "--time-scale", type=float, default=0.1, help="simulator speed-up: 0.1 = ten times real time"
    )
    p.add_argument("--mean-output-tokens", type=int, default=2300, help="mean simulated completion length")
    p.add_argument("--out", default="demo-output", help="demo folder (default demo-output)")
    p.add_argument("--flower-port", type=int, default=5555, help="Flower's port, if free (default 5555)")
    p.add_argument("--page-port", type=int, default=8765, help="the job page's port, if free (default 8765)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt mix and the simulators")
    p.add_argument(
        "--gpu-hour-usd",
        type=float,
        default=2.0,
        help="price of a simulated GPU-hour, for the cost figures (default 2.0)",
    )
    p.add_argument("--stop-timeout", type=float, default=15.0, help="seconds from SIGTERM to SIGKILL")
    p.add_argument("--keep-running", action="store_true", help="keep the services up until Ctrl-C")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.prompts < 1 or args.gpus < 1 or args.time_scale < 0 or args.gpu_hour_usd < 0:
        print(
            "error: --prompts and --gpus must be >= 1, --time-scale and --gpu-hour-usd >= 0", file=sys.stderr
        )
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    children = Children(out / "logs")
    status = 1
    try:
        outcome = run_demo(args, children)
        status = 0 if outcome.enqueue_status == 0 and outcome.verify_status == 0 else 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        _say("interrupted")
        status = 130
    except Terminated as exc:
        _say(f"{exc}: stopping")
        status = 143
    except (DemoError, DflashError, OSError) as exc:
        _say(f"error: {exc}")
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        _say("stopping the simulators, workers and Flower ... (Ctrl-C: kill them now)")
        children.stop_all(args.stop_timeout)
    return status


if __name__ == "__main__":
    sys.exit(main())
