"""The demo's run: the node, Flower and the page, then ``enqueue --wait`` and ``verify``."""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import add_alias
from dflash_tasks.core.errors import DflashError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.setting_values import redact_url
from dflash_tasks.core.settings import MonitorSettings
from dflash_tasks.demo.prompts import write_prompts
from dflash_tasks.demo.services import (
    FLOWER_USER,
    Children,
    DemoError,
    Terminated,
    check_redis,
    free_port,
    free_port_range,
    on_signal,
    say,
    start_page,
    wait_for_log,
    wait_port,
    watch_children,
)
from dflash_tasks.monitoring.live_yield import describe_yield
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from workers.node.main import port_in_use
from workers.node.procs import Child

DESCRIPTION = "the whole pipeline on one machine, with simulated GPUs"
MODEL = "Qwen/Qwen3-8B"
_NODE_READY = re.compile(r"node ready: (\d+) GPU")


@dataclass(frozen=True, slots=True)
class Outcome:
    enqueue_status: int
    verify_status: int
    seconds: float


def run_demo(args: argparse.Namespace, children: Children) -> Outcome:
    settings = MonitorSettings.load()
    check_redis(settings.broker_url)
    out = Path(args.output).resolve()
    prompts, completions, logs = out / "prompts.jsonl", out / "completions", out / "logs"
    shutil.rmtree(completions, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    valid, invalid = write_prompts(prompts, args.prompts, args.seed)
    say(f"wrote {prompts}: {valid:,} prompts + {invalid} malformed lines")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    model_dir = build_model_dir(out / "model", QWEN3_TEMPLATE, MODEL.rsplit("/", 1)[-1])
    say(f"built a tokenizer that fits the simulator's words in {model_dir} (the workers count with it)")
    node, urls, metrics_ports = start_node(args, children, model_dir, logs, env)
    flower, flower_url, password_shown = start_flower(args, children, settings, env)
    wait_for_log(node, _NODE_READY, 120.0)
    say(
        f"{args.gpus} simulated GPUs serving ({', '.join(urls)}, time scale {args.time_scale}); workers "
        f"on broker {redact_url(settings.broker_url)}, queue {settings.queue!r}; node log {node.log_path}"
    )
    if wait_port(int(flower_url.rsplit(":", 1)[1]), flower, 20.0):
        say(f"Flower: {flower_url}  user {FLOWER_USER}  password {password_shown}")
    else:
        say(f"Flower did not come up (see {logs / 'flower.log'}); going on without it")
    say_where_to_watch(metrics_ports, logs, completions)
    page_port = args.page_port if not port_in_use(args.page_port) else free_port()
    threading.Thread(
        target=start_page, args=(children, completions, page_port, settings, env), daemon=True
    ).start()
    outcome = run_job(args, children, prompts, completions, logs)
    say(f"prompts {prompts} | logs {logs} | Flower {flower_url} (user {FLOWER_USER})")
    if args.keep_running:
        say("services keep running: press Ctrl-C to stop them")
        watch_children([child for child in children.started if child.name in ("node", "flower", "page")])
    return outcome


def start_node(
    args: argparse.Namespace, children: Children, model_dir: Path, logs: Path, env: dict[str, str]
) -> tuple[Child, list[str], list[int]]:
    """The node of simulated GPUs: (its child, the servers' URLs, the workers' Prometheus ports)."""
    port_base = free_port_range(args.gpus)
    metrics_base = free_port_range(args.gpus)
    sim_args = (
        f"--model-path {shlex.quote(str(model_dir))} --served-model-name {MODEL} "
        f"--time-scale {args.time_scale} --mean-output-tokens {args.mean_output_tokens} --seed {args.seed}"
    )
    node_argv = [
        sys.executable, "-m", "workers.node", "--simulate", "--gpus", f"0-{args.gpus - 1}",
        "--port-base", str(port_base),
        "--sim-arg", sim_args, "--log-dir", str(logs), "--echo", "none",
    ]  # fmt: skip
    # worker N serves Prometheus on metrics_base + N
    node = children.spawn("node", node_argv, {**env, "DFLASH_METRICS_PORT": str(metrics_base)})
    urls = [f"http://127.0.0.1:{port_base + i}" for i in range(args.gpus)]
    return node, urls, [metrics_base + i for i in range(args.gpus)]


def start_flower(
    args: argparse.Namespace, children: Children, settings: MonitorSettings, env: dict[str, str]
) -> tuple[Child, str, str]:
    """Flower behind its password: (its child, its URL, the password or where it comes from)."""
    flower_port = args.flower_port if not port_in_use(args.flower_port) else free_port()
    given = settings.flower_password
    password = given or secrets.token_urlsafe(12)
    flower_env = {**env, "DFLASH_FLOWER_PASSWORD": password}  # not on the command line
    flower_argv = [sys.executable, "-m", "dflash_tasks.flower", "--port", str(flower_port)]
    flower = children.spawn("flower", flower_argv, flower_env)
    return flower, f"http://127.0.0.1:{flower_port}", "from DFLASH_FLOWER_PASSWORD" if given else password


def say_where_to_watch(metrics_ports: list[int], logs: Path, completions: Path) -> None:
    """Prometheus, the dashboard and ``status --watch``: where the run can be watched."""
    metrics_urls = ", ".join(f"http://127.0.0.1:{port}/metrics" for port in metrics_ports)
    say(f"Prometheus (one per worker): {metrics_urls}")
    say(
        "the same run on one dashboard: the node's scrape targets are in "
        f"{logs / 'prometheus-targets.json'} "
        "(file_sd); on a real run `docker compose up -d` starts Prometheus (127.0.0.1:9090) and Grafana "
        "(127.0.0.1:3000, dashboard 'dflash-tasks: the run'), and further nodes' target files go in "
        "deploy/prometheus/targets/ (docs/monitoring.md, 'Prometheus and Grafana')"
    )
    say(f"watch from another shell: python -m dflash_tasks.status --output {completions} --watch")


def run_job(
    args: argparse.Namespace, children: Children, prompts: Path, completions: Path, logs: Path
) -> Outcome:
    """``enqueue --wait`` then ``verify`` in the foreground, and the job's yield."""
    py = sys.executable
    started = time.monotonic()
    files = ["--input", str(prompts), "--output", str(completions)]
    enqueue_argv = [py, "-m", "dflash_tasks.enqueue", *files, "--model", MODEL, "--wait"]
    enqueue_argv += ["--gpu-hour-usd", str(args.gpu_hour_usd)]
    enqueue_status = children.foreground(enqueue_argv)
    seconds = time.monotonic() - started
    if enqueue_status != 0:
        say(f"enqueue exited with status {enqueue_status}; worker logs are in {logs}")
    verify_status = children.foreground([py, "-m", "dflash_tasks.verify", *files])
    say(f"job took {seconds:.0f}s; completions in {completions / 'outputs'}")
    say(yield_summary(completions, args.gpu_hour_usd, args.time_scale))
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog("dflash_tasks.demo"), description=DESCRIPTION)
    p.add_argument("--prompts", type=int, default=3000, help="valid prompts to generate (default 3000)")
    p.add_argument("--gpus", type=int, default=4, help="simulated GPUs: one simulator + worker each")
    p.add_argument(
        "--time-scale", type=float, default=0.1, help="simulator speed-up: 0.1 = ten times real time"
    )
    p.add_argument("--mean-output-tokens", type=int, default=2300, help="mean simulated completion length")
    p.add_argument("--output", default="demo-output", help="demo folder (default demo-output)")
    add_alias(p, "--out", "--output", "output", warn=True)
    p.add_argument("--flower-port", type=int, default=5555, help="Flower's port, if free (default 5555)")
    p.add_argument("--page-port", type=int, default=8765, help="the job page's port, if free (default 8765)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt mix and the simulators")
    p.add_argument(
        "--gpu-hour-usd",
        type=float,
        default=2.0,
        help="price of a simulated GPU-hour, for the cost figures (default 2.0)",
    )
    p.add_argument(
        "--stop-timeout-seconds",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="time from SIGTERM to SIGKILL (default 15)",
    )
    add_alias(p, "--stop-timeout", "--stop-timeout-seconds", "stop_timeout_seconds", type=float)
    p.add_argument("--keep-running", action="store_true", help="keep the services up until Ctrl-C")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.prompts < 1 or args.gpus < 1 or args.time_scale < 0 or args.gpu_hour_usd < 0:
        print(
            "error: --prompts and --gpus must be >= 1, --time-scale and --gpu-hour-usd >= 0", file=sys.stderr
        )
        return ExitCode.ERROR
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    children = Children(out / "logs")
    status: int = ExitCode.NOT_PASSED
    try:
        outcome = run_demo(args, children)
        if outcome.enqueue_status == 0 and outcome.verify_status == 0:
            status = ExitCode.OK
    except KeyboardInterrupt:
        print(file=sys.stderr)
        say("interrupted")
        status = ExitCode.INTERRUPTED
    except Terminated as exc:
        say(f"{exc}: stopping")
        status = 143
    except (DemoError, DflashError, OSError) as exc:
        say(f"error: {exc}")
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        say("stopping the simulators, workers and Flower ... (Ctrl-C: kill them now)")
        children.stop_all(args.stop_timeout_seconds)
    return status
