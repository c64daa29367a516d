"""What a chaos run is told (:class:`Options`), the nodes it starts (:class:`NodeSpec`), its timings."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

from dflash_tasks.coord.routing import model_queue
from tests.helpers import REPO

ARTIFACTS = REPO / "test-artifacts"

#: Short timings, as in tests/reliability, so recovery takes seconds (production: lease 60 s,
#: heartbeat 10 s, reconcile 15 s, replan 300 s).
LEASE_S = 3.0
TIMINGS = {
    "DFLASH_LEASE_SECONDS": str(LEASE_S),
    "DFLASH_HEARTBEAT_SECONDS": "0.5",
    "DFLASH_RECONCILE_SECONDS": "1",
    "DFLASH_REPLAN_SECONDS": "5",
    "DFLASH_RETRY_BACKOFF": "0.1",
    "DFLASH_RETRY_BACKOFF_MAX": "1",
    "DFLASH_HEALTH_POLL_SECONDS": "0.5",
    "DFLASH_REQUEST_TIMEOUT": "10",
    "DFLASH_REQUEST_ATTEMPTS": "8",
    "DFLASH_REQUEUE_BACKOFF": "0.5",
    "DFLASH_PROGRESS_SECONDS": "2",
    "DFLASH_METRICS_PORT": "0",
    "DFLASH_MAX_CHUNKS": "3",
    "DFLASH_REPAIR_SPACING_SECONDS": "1",
}
CLIENT_TIMEOUT_S = 10.0  # DFLASH_REQUEST_TIMEOUT above: a "hang" fault outlasts it
HANG_S = 14.0
INFLIGHT = 4  # requests per simulated GPU (the simulator's running cap too)
MEAN_TOKENS = 200
TOKENS_SIGMA = 0.2  # the spread of the simulated completions' lengths (lognormal, log space)
REASONING_FRACTION = 0.9  # the simulator's share of a completion that is thought
TOKENS_PER_S = 40.0  # the simulator's default decode speed per request
REQUEST_S = 3.0  # mean simulated request time (default): MEAN_TOKENS / TOKENS_PER_S * time scale
#: Share of the thoughts the job's ``--max-tokens`` cuts (default): repair rounds continue them.
CUT_SHARE = 0.2
#: The trainer's ``max_length``: far above every simulated completion, so each cut thought is
#: short of the horizon and continued to its end.
TRAIN_MAX_LENGTH = 4096


def cut_budget(share: float = CUT_SHARE) -> int:
    """The ``max_tokens`` that cuts about ``share`` of the simulated thoughts inside the thought.

    A completion's length is lognormal (mean :data:`MEAN_TOKENS`, log-space spread
    :data:`TOKENS_SIGMA`) and :data:`REASONING_FRACTION` of it is thought: the budget is that share
    of the completion at its ``1 - share`` quantile.
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"the share of cut thoughts must be in (0, 1), got {share}")
    mu = math.log(MEAN_TOKENS) - TOKENS_SIGMA**2 / 2
    quantile = math.exp(mu + TOKENS_SIGMA * NormalDist().inv_cdf(1.0 - share))
    return max(1, int(REASONING_FRACTION * quantile))


def sim_flags(request_s: float = REQUEST_S) -> tuple[str, ...]:
    """The simulator's flags for requests of ``request_s`` seconds on average."""
    scale = request_s * TOKENS_PER_S / MEAN_TOKENS
    return (
        "--time-scale",
        f"{scale:g}",
        "--mean-output-tokens",
        str(MEAN_TOKENS),
        "--output-tokens-sigma",
        f"{TOKENS_SIGMA:g}",
        "--reasoning-fraction",
        f"{REASONING_FRACTION:g}",
    )


SIM_FLAGS = sim_flags()
#: The job must be done this long after the last fault ended, at most (plus the work left then:
#: see :func:`finish_bound`).
RECOVERY_BOUND_S = 60.0
MODEL = "Qwen/Qwen3-8B"


def job_queue(base: str, model: str = MODEL) -> str:
    """The broker list the job's chunk messages wait in: its model's queue."""
    return model_queue(base, model)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A simulated GPU node: ``python -m workers.node --simulate`` serving ``gpus``."""

    name: str  # n1, n2, ...
    gpus: tuple[int, ...]
    netns: bool  # inside its own network namespace (can be partitioned)
    joins: bool = False  # started mid-run by the schedule, not at the start

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(f"gpu{g}" for g in self.gpus)


def topology(nodes: int) -> tuple[NodeSpec, ...]:
    """``nodes`` nodes at the start plus one that joins mid-run.

    n1 runs on the host with two GPUs when there are four nodes or more; the others have one GPU
    each and alternate: namespaced, namespaced, host, ...; the joining node is namespaced.
    """
    if nodes < 2:
        raise ValueError("a chaos run needs at least 2 nodes")
    specs: list[NodeSpec] = []
    gpu = 0
    for i in range(1, nodes + 2):
        count = 2 if i == 1 and nodes >= 4 else 1
        joins = i == nodes + 1
        netns = joins or (i > 1 and (i - 2) % 3 != 2)
        specs.append(NodeSpec(f"n{i}", tuple(range(gpu, gpu + count)), netns, joins))
        gpu += count
    return tuple(specs)


@dataclass(frozen=True, slots=True)
class Options:
    """One chaos run (``python -m tests.chaos --help``)."""

    minutes: float = 10.0
    seed: int = 1
    store: str = "local"  # local (a tmpfs that can be filled) | s3 (moto behind fault proxies)
    nodes: int = 4
    prompts: int = 0  # 0: sized so the job's first pass fills the window with every GPU busy
    keep: bool = False  # keep the run folder even when every invariant holds
    label: str = ""  # the row name in test-artifacts/chaos.{json,md}; default from minutes
    artifacts: Path = ARTIFACTS
    run_dir: Path | None = None
    request_s: float = REQUEST_S  # mean simulated request time; the job is sized to it
    max_tokens: int = field(default_factory=cut_budget)  # the job's budget: cuts ~CUT_SHARE of thoughts
    extra: tuple[str, ...] = field(default_factory=tuple)

    @property
    def window_s(self) -> float:
        return self.minutes * 60.0

    @property
    def topology(self) -> tuple[NodeSpec, ...]:
        return topology(self.nodes)

    @property
    def gpus_at_start(self) -> int:
        return sum(len(n.gpus) for n in self.topology if not n.joins)

    def prompt_count(self) -> int:
        """Prompts in the job: what the GPUs at the start would finish in the window, unfaulted."""
        if self.prompts:
            return self.prompts
        per_s = self.gpus_at_start * INFLIGHT / self.request_s
        return max(200, int(per_s * self.window_s))

    def chunk_size(self) -> int:
        """About 150 chunks: small enough that faults hit many, large enough to stay cheap."""
        return max(4, min(16, self.prompt_count() // 150))

    def replay(self) -> str:
        """The one command that replays this run's schedule."""
        args = [f"--minutes {self.minutes:g}", f"--seed {self.seed}"]
        if self.store != "local":
            args.append(f"--store {self.store}")
        if self.nodes != 4:
            args.append(f"--nodes {self.nodes}")
        if self.prompts:
            args.append(f"--prompts {self.prompts}")
        if self.request_s != REQUEST_S:
            args.append(f"--request-seconds {self.request_s:g}")
        if self.max_tokens != cut_budget():
            args.append(f"--max-tokens {self.max_tokens}")
        return f"make chaos CHAOS_ARGS={shlex.quote(' '.join(args))}"

    def name(self) -> str:
        return self.label or f"{self.minutes:g} min, seed {self.seed}, {self.store} store"
