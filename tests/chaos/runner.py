"""One chaos run, start to end: set up, print the schedule, inject it, heal, wait, check, tear down."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests

from tests.chaos import checker, procs, rounds
from tests.chaos import schedule as S
from tests.chaos.checker import Result
from tests.chaos.cluster import Node, Producer
from tests.chaos.config import (
    INFLIGHT,
    LEASE_S,
    RECOVERY_BOUND_S,
    TIMINGS,
    TRAIN_MAX_LENGTH,
    Options,
    job_queue,
    sim_flags,
)
from tests.chaos.history import History, Recorder, verify_argv
from tests.chaos.injector import Injector
from tests.chaos.inputs import write_input
from tests.chaos.nemeses import World
from tests.chaos.netns import NetLab, available
from tests.chaos.services import LocalOutput, Output, RedisProc, S3Output, new_run_id
from tests.chaos.teardown import tear_down
from tests.helpers import REPO


class Run:
    def __init__(self, opts: Options, say: Callable[[str], None] = print) -> None:
        self.opts = opts
        self.say = say
        self.run_id = new_run_id()
        self.dir = opts.run_dir or Path(tempfile.mkdtemp(prefix=f"dflash-chaos-s{opts.seed}-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.schedule = S.build(opts.seed, opts.window_s, opts.topology, opts.store)
        self.injector: Injector | None = None
        self.queue = f"chaos-{self.run_id}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_", "AWS_"))},
            **TIMINGS,
            "DFLASH_QUEUE": self.queue,
            "DFLASH_REDIS_PREFIX": f"chaos-{self.run_id}",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO),
            procs.MARKER: self.run_id,
        }
        self.result = Result(opts.seed, opts.minutes, opts.store, label=opts.name(), replay=opts.replay())
        self.result.max_tokens = opts.max_tokens
        self.net: NetLab | None = None
        self.redis: RedisProc | None = None
        self.output: Output | None = None
        self.nodes: dict[str, Node] = {}
        self.producer: Producer | None = None
        self.history: History | None = None
        self.recorder: Recorder | None = None
        self.problems: list[str] = []
        self.store_checked = False
        self.started = time.monotonic()

    # --- set-up -------------------------------------------------------------------------------
    def setup(self) -> None:
        why = available()
        if why:
            raise SystemExit(f"chaos: {why} (run it as root, as CI does)")
        opts = self.opts
        self.net = NetLab(self.run_id)
        links = {spec.name: self.net.add(spec.name) for spec in opts.topology if spec.netns}
        env = {**self.env, "DFLASH_BROKER_URL": "redis://127.0.0.1:1/0"}  # each process gets its own
        self.redis = RedisProc(
            self.dir / "redis", ["127.0.0.1", *(link.host_ip("redis") for link in links.values())], env
        )
        self.redis.start()
        if opts.store == "s3":
            self.output = S3Output(self.dir / "s3", [link.host_ip("store") for link in links.values()])
        else:
            self.output = LocalOutput(self.dir / "store")
        self.inp = self.dir / "prompts.jsonl"
        self.expected, self.bad_lines = write_input(self.inp, opts.prompt_count())
        flags = sim_flags(opts.request_s)
        for spec in opts.topology:
            self.nodes[spec.name] = Node(
                spec, links.get(spec.name), self.dir / "nodes", env, self.redis, self.output, flags
            )
        for node in self.nodes.values():
            if not node.spec.joins:
                node.start()
        deadline = time.monotonic() + 180
        for node in self.nodes.values():
            while not node.spec.joins and not node.ready():
                if time.monotonic() > deadline or (node.proc is not None and node.proc.poll() is not None):
                    raise RuntimeError(f"node {node.name} did not get ready: see {node.folder}/node.log")
                time.sleep(0.2)
        producer_env = {**env, "DFLASH_BROKER_URL": self.redis.url()}
        self.producer = Producer(
            self.dir, producer_env, self.inp, self.output, opts.chunk_size(), opts.max_tokens
        )
        self.env_store = self.producer.env  # verify and export reach the store as the producer does

    # --- the fault window -----------------------------------------------------------------------
    def inject(self) -> None:
        assert self.redis and self.output and self.producer
        self.history = h = History(self.dir / "history.jsonl")
        h.record(
            "schedule",
            seed=self.opts.seed,
            faults=[f.as_dict() for f in self.schedule.faults],
            repair=[f.as_dict() for f in self.schedule.repair],
        )
        verify_env = {**self.producer.env}
        self.recorder = rec = Recorder(
            h,
            self.output,
            self.redis,
            self.nodes,
            self.env["DFLASH_REDIS_PREFIX"],
            job_queue(self.queue),
            verify_argv(self.inp, self.output.uri),
            verify_env,
            verify_every=max(20.0, self.opts.window_s / 10),
        )
        queue = job_queue(self.queue)
        world = World(self.nodes, self.redis, self.output, self.producer, self.net, queue, rec.poll_sim)
        self.world = world
        self.injector = Injector(self.schedule, h, rec, world, self.nodes, self.say)
        rec.start()
        while h.now() < self.opts.window_s or self.injector.window_left():
            self._tick()
            time.sleep(0.1)

    def _tick(self) -> None:
        assert self.producer and self.history and self.injector
        said = self.producer.tick()
        if said:
            self.history.record("producer", what=said)
            self.say(f"[{self.history.now():7.1f}s] {said}")
        for line in self.producer.repair_rounds():
            self.history.record("repair_round", what=line)
            self.say(f"[{self.history.now():7.1f}s] producer: {line}")
            self.injector.arm_repair_phase()
        self.injector.advance()

    # --- after the window ---------------------------------------------------------------------------
    def heal_all(self) -> float:
        """Undo whatever is still broken; returns the time (history clock) of the last heal."""
        assert self.history and self.producer and self.output and self.redis and self.injector
        self.injector.heal_repair_phase()  # if it began in the window
        if self.net is not None:
            self.net.heal_all()
        self.output.unfail()
        for pid in list(self.world.paused.values()):
            procs.send(pid, signal.SIGCONT)
        self.world.paused.clear()
        if not self.redis.ping():
            self.redis.start()
        for node in self.nodes.values():
            if node.alive():
                for gpu in node.spec.gpus:
                    with contextlib.suppress(requests.RequestException):
                        requests.post(f"{node.sim_url(gpu)}/sim/faults", json={"kind": "clear"}, timeout=3)
        if not self.producer.running() and not self.producer.done:
            self.producer.start()
        healed = self._last_fault()
        self.history.record("healed_all", last_fault=healed)
        return healed

    def _last_fault(self) -> float:
        """When the last fault started or healed (history clock)."""
        assert self.history
        return float(max((e["t"] for e in self.history.of("fault_stop", "fault_start")), default=0.0))

    def wait_done(self, last_fault: float) -> None:
        assert self.history and self.producer and self.recorder and self.injector
        manifest = None
        while manifest is None:
            manifest = self.recorder.manifest
            if manifest is None:
                self._tick()
                time.sleep(0.5)
        left = manifest.samples - self.recorder.latest_store[1]
        gpus = sum(len(n.spec.gpus) for n in self.nodes.values() if n.alive())
        nominal = left / max(1, gpus) / INFLIGHT * self.opts.request_s
        bound = RECOVERY_BOUND_S + 2 * nominal
        self.result.bound_s = round(bound, 1)
        self.history.record("bound", samples_left=left, gpus=gpus, bound_s=bound)
        self.say(
            f"[{self.history.now():7.1f}s] fault window over; everything healed. {left:,} samples left on "
            f"{gpus} GPUs: the job must be done within {bound:.0f} s (60 s + twice their nominal time)"
        )
        while True:
            while not (self.producer.done and self.recorder.latest_store[0] >= manifest.chunks):
                last_fault = max(last_fault, self._last_fault())  # the repair phase's faults count
                if self.history.now() > last_fault + bound + 120:  # past the bound: give up, keep the logs
                    break
                self._tick()
                time.sleep(0.2)
            self.injector.end_repair_phase()
            if not self.producer.done or self.result.reruns_for_repairs or not self._rerun_for_repairs():
                break
        last_fault = max(last_fault, self._last_fault())
        time.sleep(1.0)  # the recorder samples twice a second: let it see the last repair files
        if self.recorder.latest_store[0] >= manifest.chunks:
            done_at = max(e["t"] for e in self.history.of("chunk_stored", "repair_stored"))
            self.result.done_after_last_fault_s = round(max(0.0, done_at - last_fault), 1)
            self.history.record("job_done", at=done_at, after_last_fault=done_at - last_fault)
            if done_at - last_fault > bound:
                self.problems.append(
                    f"the job was done {done_at - last_fault:.0f} s after the last fault, "
                    f"over the {bound:.0f} s bound"
                )
        else:
            self.problems.append(
                f"the job was not done {self.history.now() - last_fault:.0f} s after the last fault "
                f"({self.recorder.latest_store[0]} of {manifest.chunks} chunks stored)"
            )
        if not self.producer.done:
            self.problems.append("the producer (enqueue --wait) never finished successfully")

    def _rerun_for_repairs(self) -> bool:
        """Re-run the producer once when it finished with samples left to repair or continue.

        Its rounds may have run under faults and spent themselves (a Redis loss makes a round look
        finished); the operator's answer to its "N left" is to run it again, now in a healed
        cluster. True when it was re-run.
        """
        assert self.output is not None and self.history is not None and self.producer is not None
        chunks = rounds.load(self.output)
        counts, _ = rounds.check_rounds(chunks)
        _, transient = checker.repair_counts(list(rounds.current_records(chunks)))
        if not counts.left_cut and not transient:
            return False
        self.result.reruns_for_repairs += 1
        self.history.record("producer_rerun", left_cut=counts.left_cut, transient=transient)
        self.say(
            f"[{self.history.now():7.1f}s] the producer finished with {counts.left_cut} thoughts left cut "
            f"and {transient} transient failures: re-run once in the healed cluster"
        )
        self.producer.rerun()
        return True

    # --- tear-down -----------------------------------------------------------------------------------
    def teardown(self) -> None:
        """Stop the nodes as an operator would; then nothing of the run may be left running."""
        tear_down(self)

    # --- the check -------------------------------------------------------------------------------------
    def check_store(self) -> None:
        """Account for every sample in the final store, verify it and export it (before tear-down)."""
        assert self.output is not None
        r = self.result
        chunks = rounds.load(self.output)
        records = list(rounds.current_records(chunks))
        acc = checker.account(self.expected, records)
        counts, problems = rounds.check_rounds(chunks)
        r.cut_thoughts, r.continued, r.left_cut = counts.cut, counts.continued, counts.left_cut
        r.continuations_failed, r.repair_rounds = counts.continuations_failed, counts.rounds
        r.continuation_requests = counts.continuation_requests
        self.problems.extend(checker.dedupe(problems))
        if counts.left_cut:
            self.problems.append(f"thoughts left cut after the repair rounds: {counts.left_cut}")
        r.samples_expected, r.stored_once, r.lost = acc.expected, acc.stored_once, acc.lost
        r.duplicated, r.unexpected, r.failed_records = acc.duplicated, acc.unexpected, acc.failed
        r.repaired, r.transient_left = checker.repair_counts(records)
        r.invalid_lines = self.bad_lines
        if acc.lost or acc.duplicated or acc.unexpected or acc.stored_once != acc.expected:
            self.problems.append(f"store: {acc}")
        if r.transient_left:  # enqueue --wait ran its repair rounds in a healed cluster
            self.problems.append(f"samples left failed by a transient fault after repair: {r.transient_left}")
        self.problems.extend(
            checker.verify_and_export(
                self.inp,
                self.output.uri,
                self.expected,
                self.bad_lines,
                self.dir,
                self.env_store,
                rounds.continued_turns(chunks),
            )
        )
        self.store_checked = True

    def check(self) -> Result:
        r = self.result
        assert self.history and self.recorder
        events = self.history.events
        r.faults_scheduled = len(self.schedule.faults) + len(self.schedule.repair)
        r.faults_injected, r.faults_skipped, r.kinds = checker.faults_summary(events)
        r.max_overlap = self.schedule.max_overlap()
        r.requests_served = self.recorder.served()
        r.sim_faults_fired = self.recorder.served("faults_injected")
        # one request per sample turn, and one per continuation of a cut thought
        r.wasted_requests = r.requests_served - r.samples_expected - r.continuation_requests
        r.repair_phase, r.faults_during_repairs = checker.repair_overlap(events)
        r.recoveries, r.worst_recovery_s, r.worst_recovery = checker.recoveries(events)
        r.unrecovered = sum(1 for w in self.recorder.watches if not w.done())
        r.run_s = round(time.monotonic() - self.started, 1)
        r.run_dir = str(self.dir)
        v = list(self.problems)
        if not self.store_checked:
            v.append("the final store was not checked (the run stopped early)")
        v += checker.check_history(events)
        r.violations = v
        return r


def main_run(opts: Options, say: Callable[[str], None] = print) -> Result:
    run = Run(opts, say)
    gpus = sum(len(n.gpus) for n in opts.topology)
    say(
        f"chaos: seed {opts.seed}, {opts.minutes:g} min of faults, {opts.store} store, "
        f"{len(opts.topology) - 1} nodes + 1 joining ({gpus} simulated GPUs), "
        f"{opts.prompt_count():,} prompts in chunks of {opts.chunk_size()}, {opts.request_s:g} s a request, "
        f"max_tokens {opts.max_tokens} (thoughts cut past it are continued up to max_length "
        f"{TRAIN_MAX_LENGTH:,}); lease {LEASE_S:g} s"
    )
    say(f"chaos: run folder {run.dir}")
    for line in run.schedule.lines():
        say(line)
    say(f"chaos: replay with: {opts.replay()}")
    try:
        run.setup()
        run.inject()
        last = run.heal_all()
        run.wait_done(last)
        assert run.recorder is not None
        run.recorder.finish()
        run.check_store()
    except BaseException as exc:
        run.problems.append(f"the run itself failed: {type(exc).__name__}: {exc}")
        if not isinstance(exc, Exception):
            raise
    finally:
        run.teardown()
    if run.history is None or run.recorder is None:  # it never got to the fault window
        run.result.violations = run.problems
        for v in run.problems:
            say(f"chaos: INVARIANT BROKEN: {v}")
        say(f"chaos: logs kept in {run.dir}; replay: {opts.replay()}")
        say(run.result.summary_line())
        return run.result
    result = run.check()
    if result.passed and not opts.keep:
        shutil.rmtree(run.dir, ignore_errors=True)
        result.run_dir = ""
    md, js = checker.write_artifacts(result, opts.artifacts)
    for v in result.violations:
        say(f"chaos: INVARIANT BROKEN: {v}")
    say(f"chaos: results in {md} and {js}")
    if result.run_dir:
        say(f"chaos: logs and history kept in {run.dir} (history.jsonl, nodes/*/, producer.log, redis/)")
        if not result.passed:
            say(f"chaos: replay: {opts.replay()}")
    say(result.summary_line())
    return result
