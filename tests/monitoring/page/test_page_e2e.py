"""The job's page, end to end: a live job (simulator, two real workers, ``enqueue --wait``) and the
page in real headless Chromium during it and after it; then the same output with Redis gone.

Figures on the page are read from their ``data-figure`` attributes and compared with
``status --json`` and ``progress.json``; the truncated filter with the stored records; one sample's
highlighted tokens with the loss-token count of its row.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from dflash_tasks.core.loss_tokens import LossTokenCounter, load_tokenizer, row_messages
from dflash_tasks.core.record import Record
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, build_model_dir
from tests.helpers import (
    REPO,
    Processes,
    RedisServer,
    free_port,
    processes,
    read_records,
    wait_until,
    write_prompts,
)
from tests.monitoring.test_monitoring_e2e import CHROMIUM, CHROMIUM_ARGS

MODEL = "Qwen/Qwen3-8B"
ARTIFACTS = REPO / "test-artifacts"
USER, PASSWORD = "viewer", "pw-" + uuid.uuid4().hex[:10]
SAMPLES, CHUNK = 160, 10
#: Figures that must equal status --json once the job is done.
FINAL_FIGURES = (
    "state",
    "samples.total",
    "samples.done",
    "samples.ok",
    "samples.failed",
    "samples.repaired",
    "samples.remaining",
    "chunks.total",
    "chunks.done",
    "chunks.running",
    "chunks.pending",
    "tokens.generated",
    "tokens.avg_per_sample",
    "elapsed_s",
    "spec_accept_length",
    "cost.gpu_hour_usd",
)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent: `make browser`")


@dataclass
class Run:
    procs: Processes
    out: Path
    model_dir: Path
    url: str
    page: subprocess.Popen[bytes]
    live: dict[str, Any]  # what the browser saw during the job


def dig(doc: Any, path: str) -> Any:
    for part in path.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def as_figure(value: Any) -> str:
    return "" if value is None else str(value)


def page_figures(page: Any) -> dict[str, str]:
    return dict(
        page.eval_on_selector_all("[data-figure]", "els => els.map(e => [e.dataset.figure, e.dataset.value])")
    )


def status_json(procs: Processes, out: Path) -> dict[str, Any]:
    res = procs.run("dflash_tasks.status", "--output", str(out), "--json")
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def start_page(
    procs: Processes, out: Path, model_dir: Path, name: str
) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    procs.env["DFLASH_PAGE_BASIC_AUTH"] = f"{USER}:{PASSWORD}"
    try:
        proc = procs.spawn(
            [
                "-m",
                "dflash_tasks.page",
                "--output",
                str(out),
                "--port",
                str(port),
                "--refresh-seconds",
                "1",
                "--tokenizer",
                str(model_dir),
                "--gpu-hour-usd",
                "2.5",
            ],
            f"{name}.log",
        )
    finally:
        del procs.env["DFLASH_PAGE_BASIC_AUTH"]
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _answers(url), 30, "the page to answer")
    return url, proc


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 401
    except requests.RequestException:
        return False


def browser_context(pw: Any) -> tuple[Any, Any]:
    browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    context = browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD}, viewport={"width": 1400, "height": 1000}
    )
    return browser, context


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Run]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (a dev dependency) is missing")
    tmp = tmp_path_factory.mktemp("page")
    model_dir = build_model_dir(tmp, QWEN3_TEMPLATE)
    with processes(tmp, redis_server.url, f"q{uuid.uuid4().hex[:8]}") as procs:
        procs.env["DFLASH_PROGRESS_SECONDS"] = "1"
        inp, out = tmp / "prompts.jsonl", tmp / "out"
        write_prompts(inp, SAMPLES, long_at=5)  # one prompt over the context: one failed sample
        sim = procs.simulator(
            "--time-scale", "0.1", "--mean-output-tokens", "500", "--context-length", "8192"
        )
        for name in ("gpu0", "gpu1"):
            procs.worker(sim, name, "--max-inflight", "4")
        enqueue = procs.spawn(
            [
                "-m",
                "dflash_tasks.enqueue",
                "--input",
                str(inp),
                "--output",
                str(out),
                "--model",
                MODEL,
                "--max-tokens",
                "600",
                "--chunk-size",
                str(CHUNK),
                "--no-preflight",
                "--gpu-hour-usd",
                "2.5",
                "--wait",
                "--json",
            ],
            "enqueue.log",
        )
        wait_until(lambda: (out / "job.json").exists(), 60, "the job to be staged")
        url, page_proc = start_page(procs, out, model_dir, "page")
        ARTIFACTS.mkdir(exist_ok=True)
        with sync_api.sync_playwright() as pw:
            browser, context = browser_context(pw)
            try:
                page = context.new_page()

                def seen_running() -> dict[str, str] | None:
                    page.goto(url + "/")
                    figures = page_figures(page)
                    return (
                        figures
                        if figures["state"] == "running" and int(figures["samples.done"]) > 0
                        else None
                    )

                live = wait_until(seen_running, 60, "the page to show the job running", interval=0.5)
                after = status_json(procs, out)
                page.screenshot(path=str(ARTIFACTS / "page-run-live.png"), full_page=True)
            finally:
                browser.close()
        assert enqueue.wait(240) == 0, (tmp / "enqueue.log").read_text()[-2000:]
        yield Run(procs, out, model_dir, url, page_proc, {"figures": live, "status_after": after})


def test_during_the_job_the_page_shows_it_running(run: Run) -> None:
    figures, after = run.live["figures"], run.live["status_after"]
    assert figures["samples.total"] == str(SAMPLES) == str(after["samples"]["total"])
    assert figures["chunks.total"] == str(after["chunks"]["total"])
    assert 0 < int(figures["samples.done"]) <= after["samples"]["done"]
    assert int(figures["samples.done"]) < SAMPLES  # caught while running
    assert figures["cost.gpu_hour_usd"] == "2.5"
    assert {"workers.0.samples", "workers.1.samples"} <= figures.keys()  # both GPUs
    assert (ARTIFACTS / "page-run-live.png").stat().st_size > 10_000


def test_after_the_job_the_figures_equal_status_json_and_progress_json(run: Run) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    wait_until(lambda: json.loads((run.out / "progress.json").read_text())["state"] == "done", 30, "done")
    with sync_api.sync_playwright() as pw:
        browser, context = browser_context(pw)
        try:
            page = context.new_page()
            page.goto(run.url + "/")
            figures = page_figures(page)
            page.screenshot(path=str(ARTIFACTS / "page-run.png"), full_page=True)
            svg = context.request.get(run.url + "/throughput.svg").text()
        finally:
            browser.close()
    doc = status_json(run.procs, run.out)
    progress = json.loads((run.out / "progress.json").read_text())
    for path in FINAL_FIGURES:
        assert figures[path] == as_figure(dig(doc, path)), path
    for path in ("samples.done", "samples.failed", "chunks.done", "tokens.generated"):
        assert figures[path] == as_figure(dig(progress, path)), path
    workers = {w["name"]: w for w in doc["workers"]}
    assert len(workers) == 2
    for i, w in enumerate(doc["workers"]):
        assert figures[f"workers.{i}.samples"] == str(w["samples"])
        assert figures[f"workers.{i}.max_inflight"] == str(w["max_inflight"]) == "4"
    truncated = doc["counters"].get("check_truncated", 0)
    assert truncated > 0 and figures["counters.check_truncated"] == as_figure(truncated)
    assert "<polyline" in svg  # the page saw the job move: a plot, not the empty note


def test_the_truncated_filter_lists_exactly_the_truncated_samples(run: Run) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    expected = [str(r["id"]) for r in read_records(run.out) if r["outcome"] == "truncated"]
    assert 0 < len(expected) < SAMPLES
    listed: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser, context = browser_context(pw)
        try:
            page = context.new_page()
            page.goto(run.url + "/samples")
            page.select_option("select[name=outcome]", "truncated")
            page.click("button[type=submit]")
            while True:
                listed += page.eval_on_selector_all("a.sample", "els => els.map(e => e.textContent)")
                if page.query_selector("#next") is None:
                    break
                page.click("#next")
        finally:
            browser.close()
    assert listed == expected


def test_one_sample_marks_as_many_tokens_as_the_trainer_learns(run: Run) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    rows = [r for r in read_records(run.out) if r["status"] == "ok"]
    record = Record.from_dict(rows[7])
    counter = LossTokenCounter(load_tokenizer(str(run.model_dir)), TrainerView(), True, "test")
    expected = counter.count(row_messages(record)).loss_tokens
    with sync_api.sync_playwright() as pw:
        browser, context = browser_context(pw)
        try:
            page = context.new_page()
            page.goto(run.url + "/samples?id=" + record.id)
            page.click(f"a.sample:text-is('{record.id}')")
            page.wait_for_selector("pre.trainer")
            marked = page.eval_on_selector_all("pre.trainer span.tok.t", "els => els.length")
            shown = page.inner_text("pre.answer")
            page.screenshot(path=str(ARTIFACTS / "page-sample.png"), full_page=True)
            shared = page.url
        finally:
            browser.close()
    assert marked == expected > 0
    assert shown.strip() == record.turns[-1].content.strip()
    assert f"/samples/{record.id}" in shared
    assert (ARTIFACTS / "page-sample.png").stat().st_size > 10_000


def test_a_wrong_password_gets_a_401_and_nothing(run: Run) -> None:
    for path in ("/", "/api/progress", "/samples", "/samples/random", "/throughput.svg"):
        for auth in (None, (USER, "wrong"), ("admin", PASSWORD)):
            res = requests.get(run.url + path, auth=auth, timeout=5, allow_redirects=False)
            assert res.status_code == 401 and res.content == b"", (path, auth)
            assert res.headers["WWW-Authenticate"].startswith("Basic")
    good = requests.get(run.url + "/api/progress", auth=(USER, PASSWORD), timeout=5)
    assert good.status_code == 200 and good.json()["progress"]["state"] == "done"


def test_the_log_holds_no_sample_text_nor_the_password(run: Run) -> None:
    res = requests.get(run.url + "/samples?id=Question", auth=(USER, PASSWORD), timeout=5)
    assert res.status_code == 200
    page_log = run.procs.tmp / "page.log"
    # Tornado logs a request after its response is sent: the line may land a moment after the reply.
    wait_until(lambda: "SamplesHandler 200" in page_log.read_text(), 10, "the page to log the request")
    log = page_log.read_text()
    assert "RunHandler 200" in log
    assert "Question" not in log and PASSWORD not in log and "/samples" not in log


def test_a_finished_job_without_redis_shows_the_same_page(run: Run) -> None:
    progress = json.loads((run.out / "progress.json").read_text())
    run.procs.env["DFLASH_BROKER_URL"] = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    try:
        url, _ = start_page(run.procs, run.out, run.model_dir, "page-no-redis")
    finally:
        run.procs.env["DFLASH_BROKER_URL"] = run.procs.broker_url
    doc = requests.get(url + "/api/progress", auth=(USER, PASSWORD), timeout=10).json()["progress"]
    html = requests.get(url + "/", auth=(USER, PASSWORD), timeout=10).text
    assert doc["state"] == "done" and doc["samples"] == progress["samples"]
    assert doc["tokens"] == progress["tokens"]
    for path in ("samples.done", "samples.failed", "tokens.generated"):
        assert f"data-figure='{path}' data-value='{dig(progress, path)}'" in html
    listing = requests.get(url + "/samples?outcome=failed", auth=(USER, PASSWORD), timeout=10).text
    assert listing.count("class='sample'") == progress["samples"]["failed"] == 1
