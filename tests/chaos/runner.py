"""One chaos run, start to end: set up, print the schedule, inject it, heal, wait, check, tear down."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from tests.chaos import checker, procs
from tests.chaos import schedule as S
from tests.chaos.checker import Result
from tests.chaos.cluster import Node, Producer
from tests.chaos.config import INFLIGHT, LEASE_S, RECOVERY_BOUND_S, TIMINGS, Options, job_queue, sim_flags
from tests.chaos.history import History, Recorder, verify_argv
from tests.chaos.inputs import write_input
from tests.chaos.nemeses import Skip, World, nemeses
from tests.chaos.netns import NetLab, available
from tests.chaos.services import LocalOutput, Output, RedisProc, S3Output, new_run_id
from tests.chaos.teardown import tear_down
from tests.helpers import REPO

#: faults whose victims are the chunks held by the target's workers when it strikes
_WORKER_FAULTS = {S.WORKER_KILL, S.WORKER_TERM, S.WORKER_PAUSE, S.SIM_RESTART}
_NODE_FAULTS = {S.NODE_KILL, S.PARTITION_REDIS, S.PARTITION_ALL}


class Run:
    def __init__(self, opts: Options, say: Callable[[str], None] = print) -> None:
        self.opts = opts
        self.say = say
        self.run_id = new_run_id()
        self.dir = opts.run_dir or Path(tempfile.mkdtemp(prefix=f"dflash-chaos-s{opts.seed}-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.schedule = S.build(opts.seed, opts.window_s, opts.topology, opts.store)
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
        self.producer = Producer(self.dir, producer_env, self.inp, self.output, opts.chunk_size())
        self.env_store = self.producer.env  # verify and export reach the store as the producer does

    # --- the fault window -----------------------------------------------------------------------
    def inject(self) -> None:
        assert self.redis and self.output and self.producer
        self.history = h = History(self.dir / "history.jsonl")
        h.record("schedule", seed=self.opts.seed, faults=[f.as_dict() for f in self.schedule.faults])
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
        rec.start()
        table = nemeses()
        # (time, 0 = stop before start at the same time, index, fault)
        agenda: list[tuple[float, int, int, S.Fault]] = []
        for i, f in enumerate(self.schedule.faults):
            agenda.append((f.at, 1, i, f))
            if f.duration:
                agenda.append((f.end, 0, i, f))
        agenda.sort(key=lambda x: (x[0], x[1], x[2]))
        started: set[int] = set()
        for at, is_start, i, f in agenda:
            while h.now() < at:
                self._tick()
                time.sleep(min(0.1, max(0.0, at - h.now())))
            if is_start:
                self._start(table[f.kind], i, f, world, started)
                if not f.duration and i in started:
                    rec.healed(i)
            elif i in started:
                self._stop(table[f.kind], i, f, world)
        while h.now() < self.opts.window_s:
            self._tick()
            time.sleep(0.1)

    def _start(self, nemesis: Any, i: int, f: S.Fault, world: World, started: set[int]) -> None:
        assert self.history and self.recorder
        victims = self._victim_workers(f)
        try:
            watch = self.recorder.watch(i, f.kind, victims) if f.kind != S.NODE_JOIN else None
            detail = nemesis.start(i, f, world)
        except Skip as why:
            if watch is not None:
                self.recorder.watches.remove(watch)
            self.history.record("fault_skipped", index=i, kind=f.kind, target=f.target, why=str(why))
            self.say(f"[{self.history.now():7.1f}s] #{i} {f.describe()}: skipped ({why})")
            return
        started.add(i)
        self.history.record("fault_start", index=i, kind=f.kind, target=f.target, detail=detail)
        self.say(f"[{self.history.now():7.1f}s] #{i} {f.describe()} {_short(detail)}")

    def _stop(self, nemesis: Any, i: int, f: S.Fault, world: World) -> None:
        assert self.history and self.recorder
        try:
            detail = nemesis.stop(i, f, world)
        except Exception as exc:  # a heal that fails is retried by heal_all
            detail = {"error": f"{type(exc).__name__}: {exc}"}
        self.recorder.healed(i)
        self.history.record("fault_stop", index=i, kind=f.kind, target=f.target, detail=detail)
        self.say(f"[{self.history.now():7.1f}s] #{i} healed: {f.kind} {f.target}")

    def _victim_workers(self, f: S.Fault) -> list[str]:
        if f.kind in _WORKER_FAULTS:
            return [f.target.split("/")[1]]
        if f.kind in _NODE_FAULTS:
            return list(self.nodes[f.target].spec.workers)
        return []

    def _tick(self) -> None:
        assert self.producer and self.history
        said = self.producer.tick()
        if said:
            self.history.record("producer", what=said)
            self.say(f"[{self.history.now():7.1f}s] {said}")

    # --- after the window ---------------------------------------------------------------------------
    def heal_all(self) -> float:
        """Undo whatever is still broken; returns the time (history clock) of the last heal."""
        assert self.history and self.producer and self.output and self.redis
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
        healed = max((e["t"] for e in self.history.of("fault_stop", "fault_start")), default=0.0)
        self.history.record("healed_all", last_fault=healed)
        return float(healed)

    def wait_done(self, last_fault: float) -> None:
        assert self.history and self.producer and self.recorder
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
        deadline = last_fault + bound
        while not (self.producer.done and self.recorder.latest_store[0] >= manifest.chunks):
            if self.history.now() > deadline + 120:  # past the bound: give up waiting, keep the logs
                break
            self._tick()
            time.sleep(0.2)
        if self.recorder.latest_store[0] >= manifest.chunks:
            done_at = max(e["t"] for e in self.history.of("chunk_stored"))
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

    # --- tear-down -----------------------------------------------------------------------------------
    def teardown(self) -> None:
        """Stop the nodes as an operator would; then nothing of the run may be left running."""
        tear_down(self)

    # --- the check -------------------------------------------------------------------------------------
    def check_store(self) -> None:
        """Account for every sample in the final store, verify it and export it (before tear-down)."""
        assert self.output is not None
        r = self.result
        records = list(self.output.records())
        acc = checker.account(self.expected, records)
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
                self.inp, self.output.uri, self.expected, self.bad_lines, self.dir, self.env_store
            )
        )
        self.store_checked = True

    def check(self) -> Result:
        r = self.result
        assert self.history and self.recorder
        events = self.history.events
        r.faults_scheduled = len(self.schedule.faults)
        r.faults_injected, r.faults_skipped, r.kinds = checker.faults_summary(events)
        r.max_overlap = self.schedule.max_overlap()
        r.requests_served = self.recorder.served()
        r.sim_faults_fired = self.recorder.served("faults_injected")
        r.wasted_requests = r.requests_served - r.samples_expected  # one request per sample turn
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


def _short(detail: dict[str, Any]) -> str:
    text = json.dumps(detail, default=str)
    return "" if text == "{}" else (text if len(text) < 100 else text[:97] + "...")


def main_run(opts: Options, say: Callable[[str], None] = print) -> Result:
    run = Run(opts, say)
    gpus = sum(len(n.gpus) for n in opts.topology)
    say(
        f"chaos: seed {opts.seed}, {opts.minutes:g} min of faults, {opts.store} store, "
        f"{len(opts.topology) - 1} nodes + 1 joining ({gpus} simulated GPUs), "
        f"{opts.prompt_count():,} prompts in chunks of {opts.chunk_size()}, {opts.request_s:g} s a request; "
        f"lease {LEASE_S:g} s"
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
