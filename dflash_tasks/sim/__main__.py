"""``python -m dflash_tasks.sim``: run the simulator until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from dflash_tasks.core.exit_codes import ExitCode
from dflash_tasks.sim.batch import CURVES
from dflash_tasks.sim.config import FAULT_KINDS, REASONING_PARSERS, FaultSpec, SimConfig
from dflash_tasks.sim.server import start_simulator


def _parser() -> argparse.ArgumentParser:
    d = SimConfig()
    p = argparse.ArgumentParser(prog=_prog(), description=__doc__)
    _add_server_flags(p, d)
    _add_stream_flags(p, d)
    _add_curve_flags(p.add_argument_group(CURVE_GROUP), d)
    _add_lifecycle_flags(p, d)
    return p


def _prog() -> str:
    # The simulator sits below the CLI's layer: its own name, as the commands' table has it.
    return "dflash-sim" if sys.argv and sys.argv[0].endswith("dflash-sim") else "python -m dflash_tasks.sim"


CURVE_GROUP = "throughput curve (dflash_tasks.sim.batch; none: a fixed rate per request)"


def _add_server_flags(p: argparse.ArgumentParser, d: SimConfig) -> None:
    """What the server says it is and how it answers: model, limits, speed, reasoning, accept length."""
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port, help="0 picks a free port")
    p.add_argument(
        "--model-path", "--model", dest="model", default=d.model, help="model_path the info endpoints report"
    )
    p.add_argument("--served-model-name", default=None, help="default: --model-path")
    p.add_argument("--context-length", type=int, default=d.context_length)
    p.add_argument("--max-running-requests", type=int, default=d.max_running_requests)
    p.add_argument("--max-queued-requests", type=int, default=None, help="default: unlimited")
    p.add_argument("--tokens-per-second", type=float, default=d.tokens_per_second, help="per request")
    p.add_argument(
        "--time-scale", type=float, default=d.time_scale, help="multiplies every duration; 0 = instant"
    )
    p.add_argument("--mean-output-tokens", type=int, default=d.mean_output_tokens)
    p.add_argument(
        "--output-tokens-sigma", type=float, default=d.output_tokens_sigma, help="lognormal spread"
    )
    p.add_argument("--reasoning-fraction", type=float, default=d.reasoning_fraction)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--reasoning-parser", choices=REASONING_PARSERS, default=d.reasoning_parser)
    p.add_argument("--ignore-thinking-flag", action="store_true", help="never reason (misconfigured server)")
    p.add_argument(
        "--accept-length", type=float, default=d.accept_length, help="mean per-request accept length"
    )
    p.add_argument(
        "--accept-length-sd", type=float, default=d.accept_length_sd, help="its spread across requests"
    )
    p.add_argument(
        "--decode-log-interval",
        type=int,
        default=d.decode_log_interval,
        help="verify passes before internal_states reports an accept length",
    )


def _add_stream_flags(p: argparse.ArgumentParser, d: SimConfig) -> None:
    """Loops in the thoughts, and how streams are sent and their clients watched."""
    p.add_argument(
        "--loop-share",
        type=float,
        default=d.loop_share,
        help="share of the samples that fall into a loop (a sentence or paragraph repeated until max_tokens)",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=d.stream_interval,
        help="a stream sends once this many tokens are unsent (SGLang's --stream-interval; 1: every step)",
    )
    p.add_argument(
        "--disconnect-poll-seconds",
        type=float,
        default=d.disconnect_poll_seconds,
        help="how often a waiting request's connection is checked (SGLang: 4 s)",
    )
    p.add_argument(
        "--stream-stall-seconds",
        type=float,
        default=d.stream_stall_seconds,
        help="a streaming client that reads nothing this long while bytes wait is dropped (aborted)",
    )


def _add_curve_flags(curve: argparse._ArgumentGroup, d: SimConfig) -> None:
    """How throughput and the accept length bend with the batch, and the KV cache's size."""
    curve.add_argument("--curve", choices=sorted(CURVES), default=None, help="a named curve (sets the knobs)")
    curve.add_argument(
        "--batch-knee", type=float, default=d.batch_knee, help="batch where a step turns compute-bound"
    )
    curve.add_argument(
        "--accept-halving-batch",
        type=float,
        default=d.accept_halving_batch,
        help="batch at which the accept length's gain over 1 halves (0: constant)",
    )
    curve.add_argument(
        "--cuda-graph-max-bs-decode",
        type=int,
        default=d.cuda_graph_max_bs_decode,
        help="decode graph ceiling: larger batches run --eager-slowdown times slower (0: none)",
    )
    curve.add_argument("--eager-slowdown", type=float, default=d.eager_slowdown)
    curve.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=d.kv_capacity_tokens,
        help="KV cache size; past it requests are retracted (0: unlimited)",
    )
    curve.add_argument(
        "--kv-reserve-ratio",
        type=float,
        default=d.kv_reserve_ratio,
        help="share of a request's remaining budget reserved at admission (SGLang's new_token_ratio)",
    )


def _add_lifecycle_flags(p: argparse.ArgumentParser, d: SimConfig) -> None:
    """Start-up, authentication, faults and logging."""
    p.add_argument(
        "--load-seconds", type=float, default=d.load_seconds, help="the port refuses connections meanwhile"
    )
    p.add_argument(
        "--startup-seconds",
        type=float,
        default=d.startup_seconds,
        help="then /health and /ready answer 503 meanwhile (the warmup)",
    )
    p.add_argument(
        "--api-key", default=None, help="require Authorization: Bearer KEY (as SGLang's --api-key)"
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND[:COUNT]",
        help=f"inject a fault at startup (repeatable); kinds: {', '.join(sorted(FAULT_KINDS))}",
    )
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    p.add_argument(
        "--record-requests", metavar="PATH", help="append every chat request body to PATH (JSONL), for tests"
    )


def config_from_args(argv: Sequence[str] | None = None) -> SimConfig:
    """Parse the command line into a :class:`SimConfig` (exits with status 2 on bad input)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        faults = tuple(FaultSpec.parse(f) for f in args.fault)
        values = {k: v for k, v in vars(args).items() if k != "fault"}
        return SimConfig(faults=faults, **values)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; prints ``SIM READY http://HOST:PORT`` once listening.

    With ``--load-seconds`` it first prints ``SIM LOADING http://HOST:PORT`` (the port is bound
    but refuses connections).
    """
    config = config_from_args(argv)
    done = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        sim = start_simulator(config)
    except OSError as exc:
        print(f"sim: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    if not sim.listening.is_set():
        print(f"SIM LOADING {sim.url}", flush=True)
        while not (sim.listening.wait(0.05) or done.is_set()):
            pass
    if sim.listening.is_set():
        print(f"SIM READY {sim.url}", flush=True)
    while not done.wait(0.5):
        pass
    sim.stop()
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
