"""The fault schedule: same seed, same schedule; every kind of fault; faults overlap; sane targets."""

from __future__ import annotations

import random

import pytest

from dflash_tasks.sim.textgen import plan_output
from tests.chaos import schedule as S
from tests.chaos.agenda import Agenda
from tests.chaos.config import (
    CUT_SHARE,
    MEAN_TOKENS,
    REASONING_FRACTION,
    TOKENS_SIGMA,
    Options,
    cut_budget,
    sim_flags,
    topology,
)
from tests.chaos.schedule import build


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    nodes = topology(4)
    one, again, other = build(1, 600, nodes), build(1, 600, nodes), build(2, 600, nodes)
    assert one.to_json() == again.to_json()
    assert one.lines() == again.lines()
    assert one.to_json() != other.to_json()


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_ten_minute_run_has_every_kind_of_fault_several_at_once(store: str) -> None:
    sched = build(3, 600, topology(4), store)
    wanted = set(S.RATES) | {S.NODE_KILL, S.NODE_JOIN}
    if store == "local":
        wanted.discard(S.PARTITION_ALL)  # a local store is no network path: nothing to cut
    assert sched.kinds() == wanted
    assert sched.max_overlap() >= 4
    assert len(sched.faults) >= 50
    assert all(f.at >= 0 and f.end <= 600 for f in sched.faults)
    sim = {f.param("fault") for f in sched.faults if f.kind == S.SIM_FAULT}
    assert {"http_500", "http_503", "hang", "bad_json", "abort", "reset"} <= sim
    pauses = [f.duration for f in sched.faults if f.kind == S.WORKER_PAUSE]
    assert max(pauses) >= 60  # SIGCONT minutes later: the worker wakes with long-expired leases


def test_the_short_run_of_make_test_overlaps_too() -> None:
    opts = Options(minutes=1.5, seed=7, nodes=3)
    sched = build(opts.seed, opts.window_s, opts.topology)
    assert sched.max_overlap() >= 3
    assert {S.NODE_KILL, S.NODE_JOIN, S.WORKER_PAUSE, S.PARTITION_REDIS, S.REDIS_FLUSHALL} <= sched.kinds()
    assert {S.REDIS_RESTART, S.REDIS_RESTART_EMPTY, S.STORE_FAIL, S.PRODUCER_KILL} <= sched.kinds()


@pytest.mark.parametrize("seed", range(1, 9))
def test_targets_are_alive_and_partitions_hit_namespaced_nodes(seed: int) -> None:
    nodes = topology(4)
    sched = build(seed, 600, nodes, "s3")
    by_name = {n.name: n for n in nodes}
    kill = next(f for f in sched.faults if f.kind == S.NODE_KILL)
    join = next(f for f in sched.faults if f.kind == S.NODE_JOIN)
    assert by_name[join.target].joins and not by_name[kill.target].joins
    assert kill.target != nodes[0].name  # n1 always stays
    for f in sched.faults:
        if not f.target or f.kind in (S.NODE_KILL, S.NODE_JOIN):
            continue
        node = f.target.split("/")[0]
        assert not (node == kill.target and f.end + 1 >= kill.at), f  # nothing aims at a dead node
        assert not (node == join.target and f.at < join.at + 15), f  # nor at one not yet started
        if f.kind in (S.PARTITION_REDIS, S.PARTITION_ALL):
            assert by_name[node].netns, f
        if "/" in f.target:
            assert f.target.split("/")[1] in by_name[node].workers, f


def test_the_producer_is_killed_while_staging_then_while_queuing_first() -> None:
    sched = build(5, 180, topology(4))
    first, second = sched.faults[0], sched.faults[1]
    assert (first.kind, first.param("phase")) == (S.PRODUCER_KILL, "staging")
    assert (second.kind, second.param("phase")) == (S.PRODUCER_KILL, "queuing")
    assert first.at == second.at == 0.0 and first.param("after_staged") >= 2


def test_replay_command_names_every_non_default_option() -> None:
    assert Options(minutes=3, seed=1).replay() == "make chaos CHAOS_ARGS='--minutes 3 --seed 1'"
    replay = Options(minutes=1.5, seed=7, nodes=3, store="s3").replay()
    assert replay == "make chaos CHAOS_ARGS='--minutes 1.5 --seed 7 --store s3 --nodes 3'"
    fast = Options(minutes=1, seed=7, nodes=3, request_s=2.0)
    assert fast.replay() == "make chaos CHAOS_ARGS='--minutes 1 --seed 7 --nodes 3 --request-seconds 2'"


def test_the_job_is_sized_to_the_request_time() -> None:
    """Faster simulated requests: more prompts for the same window, as densely packed."""
    assert Options(minutes=1.5, seed=7, nodes=3).prompt_count() == 360
    assert Options(minutes=1, seed=7, nodes=3, request_s=2.0).prompt_count() == 360
    assert sim_flags(2.0)[:2] == ("--time-scale", "0.4") and sim_flags()[:2] == ("--time-scale", "0.6")


def test_the_default_budget_cuts_a_fifth_of_the_simulated_thoughts() -> None:
    """The budget cuts the share it names of the thoughts the simulator itself plans (its lengths,
    not the formula's own assumptions about them)."""
    plans = [
        plan_output(random.Random(i), True, MEAN_TOKENS, TOKENS_SIGMA, REASONING_FRACTION)
        for i in range(20_000)
    ]
    for share in (0.15, CUT_SHARE, 0.25):
        budget = cut_budget(share)
        cut = sum(p.reasoning_tokens > budget for p in plans) / len(plans)
        assert abs(cut - share) <= 0.03, (share, budget, cut)
    assert Options().max_tokens == 208 and "--max-tokens" not in Options().replay()
    assert Options(max_tokens=150).replay().endswith("--max-tokens 150'")


def test_the_repair_phase_has_one_fault_of_each_kind_that_matters_to_a_round_on_nodes_alive() -> None:
    sched = build(7, 60.0, topology(3), "local")
    assert build(7, 60.0, topology(3), "local").repair == sched.repair  # same seed, same faults
    assert sched.faults == build(7, 60.0, topology(3), "local").faults
    assert sorted(f.kind for f in sched.repair) == sorted(k for k, _ in S.REPAIR_FAULTS)
    assert all(0.5 <= f.at <= 3.0 for f in sched.repair)
    victim = next(f.target for f in sched.faults if f.kind == S.NODE_KILL)
    assert all(not f.target.startswith(victim + "/") and f.target != victim for f in sched.repair)
    pause = next(f for f in sched.repair if f.kind == S.WORKER_PAUSE)
    assert pause.duration >= 3 * 3.0  # past the lease: its round is taken over while it sleeps
    lines = sched.lines()
    assert any(line.startswith("repair-phase faults (7,") for line in lines), lines


def test_the_agenda_starts_the_repair_phase_from_its_first_round_and_heals_before_starting() -> None:
    window = (S.Fault(5.0, S.STORE_FAIL, "", 3.0), S.Fault(8.0, S.WORKER_KILL, "n1/gpu0"))
    repair = (S.Fault(1.0, S.WORKER_PAUSE, "n2/gpu1", 9.0), S.Fault(2.0, S.REDIS_FLUSHALL))
    agenda = Agenda(window)
    assert [(s.at, s.start, s.index) for s in agenda.due(8.0)] == [(5.0, 1, 0), (8.0, 0, 0), (8.0, 1, 1)]
    assert not agenda.window_left() and agenda.due(100.0) == []  # nothing until the phase begins
    agenda.arm(repair, 40.0)
    agenda.arm(repair, 90.0)  # once
    assert [(s.at, s.start, s.index) for s in agenda.due(42.0)] == [(41.0, 1, 2), (42.0, 1, 3)]
    assert [(s.at, s.index) for s in agenda.take(start=False)] == [(50.0, 2)]
    assert agenda.steps == []
