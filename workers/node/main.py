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

from dflash_tasks.core.errors import ConfigError, DflashError
from dflash_tasks.core.setting_values import inflight_overrides, parse_inflight, redact_url
from dflash_tasks.core.settings import DEFAULT_INFLIGHT_CEILING, DEFAULT_MAX_INFLIGHT, NodeSettings
from workers.node.launch import (
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


def inflight_type(text: str) -> int | str:
    try:
        return parse_inflight(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workers.node",
        description=__doc__.split("\n\n")[0],
        epilog="Values in [brackets] are read from that environment variable when the flag is absent.",
    )
    p.add_argument("--gpus", help="GPUs to serve: 0-6, 0,2,5, 0-3,6 [DFLASH_GPUS]")
    p.add_argument("--model", help="model directory (stage it in /dev/shm first) [DFLASH_MODEL_PATH]")
    p.add_argument(
        "--port-base", type=int, help="GPU N listens on PORT_BASE+N (default 30000) [DFLASH_PORT_BASE]"
    )
    p.add_argument(
        "--max-inflight",
        type=inflight_type,
        metavar="N|auto",
        help=f"N: a fixed N requests per GPU (default {DEFAULT_MAX_INFLIGHT}), and SGLang's caps at N "
        "[DFLASH_MAX_INFLIGHT]; auto: each worker tunes its own target, from DFLASH_MAX_INFLIGHT up "
        "to --inflight-ceiling, and the servers are capped there [DFLASH_TUNE_INFLIGHT=1]",
    )
    p.add_argument(
        "--inflight-ceiling",
        type=int,
        help=f"with auto: every server's --max-running-requests and --cuda-graph-max-bs-decode "
        f"(default {DEFAULT_INFLIGHT_CEILING}; a --sglang-arg --max-running-requests wins) "
        "[DFLASH_INFLIGHT_CEILING]",
    )
    p.add_argument(
        "--sglang-arg",
        action="append",
        default=[],
        metavar="ARGS",
        help="extra SGLang flags, shell-split, repeatable: --sglang-arg '--mem-fraction-static 0.85' "
        "(a later flag overrides an earlier one) [DFLASH_SGLANG_ARGS, applied first]",
    )
    p.add_argument(
        "--draft-model",
        default="",
        metavar="PATH",
        help="an EAGLE3 draft model for every server (for a model without MTP layers)",
    )
    p.add_argument("--simulate", action="store_true", help="run the SGLang simulator instead of SGLang")
    p.add_argument(
        "--sim-arg",
        action="append",
        default=[],
        metavar="ARGS",
        help="extra simulator flags: --sim-arg '--time-scale 0.01'",
    )
    p.add_argument("--log-dir", help="one log file per server and per worker (default logs) [DFLASH_LOG_DIR]")
    p.add_argument(
        "--echo",
        choices=["all", "workers", "none"],
        default="all",
        help="which logs to copy to stdout, prefixed",
    )
    p.add_argument(
        "--sglang-python", default="", help="interpreter with sglang installed (default: this one)"
    )
    p.add_argument("--health-interval", type=float, default=5.0, help="seconds between health probes")
    p.add_argument(
        "--server-start-timeout", type=float, default=1800.0, help="seconds for a server to get healthy"
    )
    p.add_argument(
        "--hang-restart", type=float, default=600.0, help="restart a server unhealthy this many seconds"
    )
    p.add_argument(
        "--worker-stop-timeout",
        type=float,
        default=600.0,
        help="seconds for running chunks to finish on stop",
    )
    p.add_argument("--server-stop-timeout", type=float, default=60.0, help="seconds from SIGTERM to SIGKILL")
    p.add_argument(
        "--max-failures", type=int, default=5, help="give a GPU up after this many failures in a row"
    )
    p.add_argument(
        "--restart-delay",
        type=float,
        default=1.0,
        help="seconds before restarting a dead server or worker; doubles per failure in a row, up to 60",
    )
    p.add_argument(
        "--scrape-targets",
        default="",
        metavar="PATH",
        help="write the node's Prometheus targets (servers and workers) to this file_sd JSON file "
        "(default LOG_DIR/prometheus-targets.json; 'none': do not write one)",
    )
    p.add_argument(
        "--scrape-host",
        default="",
        help="host Prometheus reaches the targets at (default: DFLASH_METRICS_ADDRESS, or this "
        "machine's name when that is 0.0.0.0)",
    )
    p.add_argument("--print-commands", action="store_true", help="print each GPU's commands and exit")
    return p


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
        sglang_python=args.sglang_python,
        # Workers' Prometheus ports (DFLASH_METRICS_PORT, 0 = off): the base plus the GPU index.
        metrics_port_base=settings.metrics_port,
        model_config=None if args.simulate else read_model_config(settings.model_path),
        draft_model=args.draft_model,
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = NodeSettings.load(
            gpus=args.gpus,
            model_path=args.model,
            port_base=args.port_base,
            **inflight_overrides(args.max_inflight),
            inflight_ceiling=args.inflight_ceiling,
            log_dir=args.log_dir,
        )
        options = options_from(args, settings)
        plans = plan_node(options, os.environ)
        if args.max_failures < 1 or args.health_interval <= 0 or args.restart_delay < 0:
            raise ConfigError("--max-failures must be >= 1, --health-interval > 0, --restart-delay >= 0")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    profile = None if args.simulate else node_profile(options)
    if args.print_commands:
        if profile:
            print(f"# {profile.describe()}")
        print(f"# {inflight_summary(options)}")
        for plan in plans:
            print(
                f"# {plan.name}\nCUDA_VISIBLE_DEVICES={plan.gpu} {shlex.join(redact_argv(plan.server_argv))}"
            )
            metrics = plan.env.get("DFLASH_METRICS_PORT")
            prefix = f"CUDA_VISIBLE_DEVICES={plan.gpu}" + (
                f" DFLASH_METRICS_PORT={metrics}" if metrics else ""
            )
            print(f"{prefix} {shlex.join(plan.worker_argv)}")
        return 0
    busy = [p.port for p in plans if port_in_use(p.port)]
    if busy:
        print(
            f"error: port(s) {', '.join(map(str, busy))} already in use on 127.0.0.1 (a server left from an "
            "earlier run? `deploy/stop-node.sh`, or pick another --port-base)",
            file=sys.stderr,
        )
        return 2
    config = SupervisorConfig(
        health_interval=args.health_interval,
        start_timeout=args.server_start_timeout,
        hang_restart=args.hang_restart,
        worker_stop_timeout=args.worker_stop_timeout,
        server_stop_timeout=args.server_stop_timeout,
        max_failures=args.max_failures,
        backoff_base=args.restart_delay,
        backoff_cap=max(60.0, args.restart_delay),
        echo=args.echo,
    )
    log_dir = Path(settings.log_dir).resolve()
    node = Node(plans, log_dir, config)
    if args.scrape_targets != "none":
        targets = Path(args.scrape_targets) if args.scrape_targets else log_dir / "prometheus-targets.json"
        host = scrape_host(settings.metrics_address, args.scrape_host)
        try:
            write_targets(targets, target_groups(plans, socket.gethostname(), settings.metrics_port, host))
        except OSError as exc:
            print(f"error: cannot write the Prometheus targets to {targets}: {exc}", file=sys.stderr)
            return 2
        node.say(f"Prometheus targets in {targets}")
    kind = "simulated GPUs" if args.simulate else "GPUs"
    node.say(
        f"{len(plans)} {kind} ({', '.join(str(p.gpu) for p in plans)}), ports "
        f"{', '.join(str(p.port) for p in plans)}; {inflight_summary(options)}; broker "
        f"{redact_url(settings.broker_url)}, queue {settings.queue!r}; logs in {log_dir}"
    )
    if profile:
        node.say(profile.describe())
    if not broker_reachable(settings.broker_url):
        node.say(
            f"warning: no Redis answers at {redact_url(settings.broker_url)} yet; workers will keep retrying"
        )

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
