"""``python -m tests.chaos --minutes N --seed S``: one chaos run (``make chaos CHAOS_ARGS='...'``).

Prints the seed and the fault schedule first and one summary line last; exits 1 when an
invariant broke (the run folder is kept, and the command that replays it is printed), 2 on bad
arguments. Needs root: network namespaces, veth links and a tmpfs.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from tests.chaos.config import ARTIFACTS, CUT_SHARE, REQUEST_S, TRAIN_MAX_LENGTH, Options, cut_budget


def parse(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="length of the fault window (default 10)")
    p.add_argument("--seed", type=int, default=1, help="the schedule's seed: same seed, same schedule")
    p.add_argument(
        "--store",
        choices=("local", "s3"),
        default="local",
        help="local: a tmpfs (disk-full faults); s3: moto behind fault proxies (503s, cut off from both)",
    )
    p.add_argument("--nodes", type=int, default=4, help="nodes at the start; one more joins mid-run")
    p.add_argument("--prompts", type=int, default=0, help="prompts in the job (default: sized to the window)")
    p.add_argument(
        "--request-seconds",
        type=float,
        default=REQUEST_S,
        help=f"mean simulated request time; the job is sized to it (default {REQUEST_S:g})",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=cut_budget(),
        help=f"the job's completion budget; the default cuts ~{CUT_SHARE:.0%} of the simulated thoughts, "
        f"which repair rounds continue up to the trainer's max_length {TRAIN_MAX_LENGTH:,} "
        "(default %(default)s)",
    )
    p.add_argument("--keep", action="store_true", help="keep the run folder even when the run passes")
    p.add_argument("--label", default="", help="the run's row in test-artifacts/chaos.{md,json}")
    p.add_argument("--artifacts", type=Path, default=ARTIFACTS, help="where chaos.md and chaos.json go")
    p.add_argument("--run-dir", type=Path, help="logs and history (default: a new temporary folder)")
    p.add_argument("--schedule-only", action="store_true", help="print the schedule and exit")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.nodes < 2 or args.prompts < 0 or args.request_seconds <= 0:
        p.error("--minutes must be > 0, --nodes >= 2, --prompts >= 0, --request-seconds > 0")
    if not 1 <= args.max_tokens < TRAIN_MAX_LENGTH:
        p.error(f"--max-tokens must be in [1, {TRAIN_MAX_LENGTH}): below the trainer's max_length")
    opts = Options(
        minutes=args.minutes,
        seed=args.seed,
        store=args.store,
        nodes=args.nodes,
        prompts=args.prompts,
        keep=args.keep,
        label=args.label,
        artifacts=args.artifacts,
        run_dir=args.run_dir,
        request_s=args.request_seconds,
        max_tokens=args.max_tokens,
    )
    if args.schedule_only:
        from tests.chaos.schedule import build

        for line in build(opts.seed, opts.window_s, opts.topology, opts.store).lines():
            print(line)
        raise SystemExit(0)
    return opts


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the run tears everything down on its way out


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    from tests.chaos.runner import main_run

    signal.signal(signal.SIGTERM, _interrupt)
    result = main_run(opts, say=lambda line: print(line, flush=True))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
