"""``python -m workers.node --gpus 0-6 --model PATH``: one SGLang server and one worker per GPU.

For each GPU N: an SGLang server on ``127.0.0.1:PORT_BASE+N`` with ``CUDA_VISIBLE_DEVICES=N`` and
the speculative decoding of the model's profile (read from ``<model>/config.json``: NEXTN for a
model with MTP layers, EAGLE3 with ``--draft-model``, otherwise none); once its
``/health_generate`` answers 200, a worker (``python -m workers --endpoint ... --name gpuN``)
bound to it. Dead servers and workers are restarted with backoff. SIGTERM stops the workers
first (running chunks finish), then the servers. ``--simulate`` runs the same topology on the
SGLang simulator (no GPU needed).

Start the same command on another GPU or machine, pointed at the same Redis
(``DFLASH_BROKER_URL``) and output store, and it takes chunks of the running job at once.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from dflash_tasks.cli.commands import prog
from dflash_tasks.cli.flags import add_setting, broker_flags, load_settings
from dflash_tasks.core.errors import ConfigError, DflashError
from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.core.setting_values import ECHO_LOGS, redact_url
from dflash_tasks.core.settings import DEFAULT_INFLIGHT_CEILING, DEFAULT_MAX_INFLIGHT, NodeSettings
from workers.node.launch import (
    GpuPlan,
    NodeOptions,
    inflight_summary,
    node_profile,
    parse_gpus,
    plan_node,
    split_args,
)
from workers.node.procs import redact_argv
from workers.node.scrape_targets import scrape_host, target_groups, write_targets
from workers.node.supervisor import Node, SupervisorConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog("workers.node"),
        description=__doc__.split("\n\n")[0],
        epilog="Values in [brackets] are read from that environment variable when the flag is absent.",
        parents=[broker_flags()],
    )
    _add_gpu_flags(p)
    _add_supervisor_flags(p.add_argument_group("the supervisor"))
    _add_output_flags(p)
    return p


def _add_gpu_flags(p: argparse.ArgumentParser) -> None:
    """What runs on each GPU: the model, its server's flags, the worker's requests in flight."""
    add_setting(p, "--gpus", NodeSettings, "gpus", "GPUs to serve: 0-6, 0,2,5, 0-3,6")
    add_setting(p, "--model", NodeSettings, "model_path", "model directory (stage it in /dev/shm first)")
    add_setting(p, "--port-base", NodeSettings, "port_base", "GPU N listens on PORT_BASE+N (default 30000)")
    add_setting(
        p,
        "--max-inflight",
        NodeSettings,
        "max_inflight",
        "auto (the default): each worker tunes its own target, from DFLASH_MAX_INFLIGHT "
        f"({DEFAULT_MAX_INFLIGHT}) up to --inflight-ceiling, and the servers are capped there "
        "[DFLASH_TUNE_INFLIGHT]; N: a fixed N requests per GPU, and SGLang's caps at N",
        metavar="N|auto",
    )
    add_setting(
        p,
        "--inflight-ceiling",
        NodeSettings,
        "inflight_ceiling",
        f"with auto: every server's --max-running-requests and --cuda-graph-max-bs-decode "
        f"(default {DEFAULT_INFLIGHT_CEILING}; a --sglang-arg --max-running-requests wins)",
    )
    p.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="ARGS",
        help="extra SGLang flags, shell-split, repeatable: --sglang-arg '--mem-fraction-static 0.85' "
        "(a later flag overrides an earlier one) [DFLASH_SGLANG_ARGS, applied first]",
    )
    add_setting(
        p,
        "--draft-model",
        NodeSettings,
        "draft_model",
        "an EAGLE3 draft model for every server (for a model without MTP layers)",
        metavar="PATH",
    )
    p.add_argument("--simulate", action="store_true", help="run the SGLang simulator instead of SGLang")
    p.add_argument(
        "--sim-arg",
        action="append",
        default=[],
        metavar="ARGS",
        help="extra simulator flags: --sim-arg '--time-scale 0.01'",
    )
    add_setting(
        p,
        "--sglang-python",
        NodeSettings,
        "sglang_python",
        "interpreter with sglang installed (default: this one)",
    )


#: The supervisor's durations: flag, setting, help (their old spellings stay as hidden aliases).
_SUPERVISOR_WAITS = (
    ("--health-interval-seconds", "health_interval_seconds", "time between health probes (default 5)"),
    (
        "--server-start-timeout-seconds",
        "server_start_timeout_seconds",
        "time for a server to get healthy (default 1800)",
    ),
    ("--hang-restart-seconds", "hang_restart_seconds", "restart a server unhealthy this long (default 600)"),
    (
        "--worker-stop-timeout-seconds",
        "worker_stop_timeout_seconds",
        "time for running chunks to finish on stop (default 600)",
    ),
    (
        "--server-stop-timeout-seconds",
        "server_stop_timeout_seconds",
        "time from SIGTERM to SIGKILL (default 60)",
    ),
    (
        "--restart-delay-seconds",
        "restart_delay_seconds",
        "delay before restarting a dead server or worker; doubles per failure in a row, up to 60 (default 1)",
    ),
)


def _add_supervisor_flags(g: argparse._ArgumentGroup) -> None:
    """How the node restarts, gives up and stops its servers and workers."""
    for flag, field, text in _SUPERVISOR_WAITS:
        add_setting(
            g, flag, NodeSettings, field, text, metavar="SECONDS", aliases=[flag.removesuffix("-seconds")]
        )
    add_setting(
        g,
        "--max-failures",
        NodeSettings,
        "max_failures",
        "give a GPU up after this many failures in a row (default 5)",
    )


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    """Where the node's logs and Prometheus targets go."""
    add_setting(
        p, "--log-dir", NodeSettings, "log_dir", "one log file per server and per worker (default logs)"
    )
    add_setting(
        p,
        "--echo",
        NodeSettings,
        "echo_logs",
        "which logs to copy to stdout, prefixed (default all)",
        choices=ECHO_LOGS,
    )
    add_setting(
        p,
        "--scrape-targets",
        NodeSettings,
        "scrape_targets",
        "write the node's Prometheus targets (servers and workers) to this file_sd JSON file "
        "(default LOG_DIR/prometheus-targets.json; 'none': do not write one)",
        metavar="PATH",
    )
    add_setting(
        p,
        "--scrape-host",
        NodeSettings,
        "scrape_host",
        "host Prometheus reaches the targets at (default: DFLASH_METRICS_ADDRESS, or this "
        "machine's name when that is 0.0.0.0)",
    )
    p.add_argument("--print-commands", action="store_true", help="print each GPU's commands and exit")


def read_model_config(model_path: str) -> dict[str, Any] | None:
    """``<model_path>/config.json`` when the model is a local directory, else None (a hub id,
    or a path this machine does not have)."""
    if not model_path or not Path(model_path).is_dir():
        return None
    path = Path(model_path) / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} is missing: a model directory needs its config.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def options_from(args: argparse.Namespace, settings: NodeSettings) -> NodeOptions:
    return NodeOptions(
        gpus=parse_gpus(settings.gpus),
        model_path=settings.model_path,
        port_base=settings.port_base,
        max_inflight=settings.max_inflight,
        tune_inflight=settings.tune_inflight,
        inflight_ceiling=settings.inflight_ceiling,
        sglang_args=split_args([settings.sglang_args, *args.sglang_arg]),
        simulate=args.simulate,
        sim_args=split_args(args.sim_arg),
        python=sys.executable,
        sglang_python=settings.sglang_python,
        # Workers' Prometheus ports (DFLASH_METRICS_PORT, 0 = off): the base plus the GPU index.
        metrics_port_base=settings.metrics_port,
        model_config=None if args.simulate else read_model_config(settings.model_path),
        draft_model=settings.draft_model,
    )


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def broker_reachable(url: str) -> bool:
    from dflash_tasks.coord.connection import ping

    try:
        ping(url, timeout=3)
    except DflashError:  # unreachable, or not a Redis URL
        return False
    return True


def supervisor_config(settings: NodeSettings) -> SupervisorConfig:
    """The supervisor's waits and limits, from the node's settings."""
    return SupervisorConfig(
        health_interval=settings.health_interval_seconds,
        start_timeout=settings.server_start_timeout_seconds,
        hang_restart=settings.hang_restart_seconds,
        worker_stop_timeout=settings.worker_stop_timeout_seconds,
        server_stop_timeout=settings.server_stop_timeout_seconds,
        max_failures=settings.max_failures,
        backoff_base=settings.restart_delay_seconds,
        backoff_cap=max(60.0, settings.restart_delay_seconds),
        echo=settings.echo_logs,
    )


def print_commands(options: NodeOptions, plans: list[GpuPlan]) -> None:
    """Each GPU's server and worker command lines (``--print-commands``)."""
    profile = None if options.simulate else node_profile(options)
    if profile:
        print(f"# {profile.describe()}")
    print(f"# {inflight_summary(options)}")
    for plan in plans:
        print(f"# {plan.name}\nCUDA_VISIBLE_DEVICES={plan.gpu} {shlex.join(redact_argv(plan.server_argv))}")
        metrics = plan.env.get("DFLASH_METRICS_PORT")
        prefix = f"CUDA_VISIBLE_DEVICES={plan.gpu}" + (f" DFLASH_METRICS_PORT={metrics}" if metrics else "")
        print(f"{prefix} {shlex.join(plan.worker_argv)}")


def write_scrape_targets(node: Node, plans: list[GpuPlan], settings: NodeSettings, log_dir: Path) -> None:
    """The node's Prometheus targets in their file (``--scrape-targets``); OSError if not writable."""
    if settings.scrape_targets == "none":
        return
    path = Path(settings.scrape_targets) if settings.scrape_targets else log_dir / "prometheus-targets.json"
    host = scrape_host(settings.metrics_address, settings.scrape_host)
    try:
        write_targets(path, target_groups(plans, socket.gethostname(), settings.metrics_port, host))
    except OSError as exc:
        raise ConfigError(f"cannot write the Prometheus targets to {path}: {exc}") from None
    node.say(f"Prometheus targets in {path}")


def announce(
    node: Node, options: NodeOptions, plans: list[GpuPlan], settings: NodeSettings, log_dir: Path
) -> None:
    """The node's first lines: GPUs, ports, in-flight policy, broker, logs and the model's profile."""
    kind = "simulated GPUs" if options.simulate else "GPUs"
    node.say(
        f"{len(plans)} {kind} ({', '.join(str(p.gpu) for p in plans)}), ports "
        f"{', '.join(str(p.port) for p in plans)}; {inflight_summary(options)}; broker "
        f"{redact_url(settings.broker_url)}, queue {settings.queue!r}; logs in {log_dir}"
    )
    if not options.simulate:
        node.say(node_profile(options).describe())
    if not broker_reachable(settings.broker_url):
        node.say(
            f"warning: no Redis answers at {redact_url(settings.broker_url)} yet; workers will keep retrying"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(NodeSettings, args)
        options = options_from(args, settings)
        # The workers inherit the node's environment: the broker and queue its flags chose too.
        env = {**os.environ, "DFLASH_BROKER_URL": settings.broker_url, "DFLASH_QUEUE": settings.queue}
        plans = plan_node(options, env)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    if args.print_commands:
        print_commands(options, plans)
        return ExitCode.OK
    busy = [p.port for p in plans if port_in_use(p.port)]
    if busy:
        print(
            f"error: port(s) {', '.join(map(str, busy))} already in use on 127.0.0.1 (a server left from an "
            "earlier run? `deploy/stop-node.sh`, or pick another --port-base)",
            file=sys.stderr,
        )
        return ExitCode.ERROR
    log_dir = Path(settings.log_dir).resolve()
    node = Node(plans, log_dir, supervisor_config(settings))
    try:
        write_scrape_targets(node, plans, settings, log_dir)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    announce(node, options, plans, settings, log_dir)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        node.say(
            f"{signal.Signals(signum).name}: "
            + ("stopping" if not node.stopping else "not waiting any longer")
        )
        node.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return node.run()


if __name__ == "__main__":
    sys.exit(main())
