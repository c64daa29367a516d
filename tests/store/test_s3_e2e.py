"""End-to-end jobs written to S3: moto's standalone server over HTTP, real Redis, real workers.

The same job as on a local directory, with ``--output s3://bucket/prefix``: enqueue stages into
the bucket, workers (separate processes, credentials and endpoint from their environment) read
the staged chunks from it and write their completions to it, and verify reads it back.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, cast

import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping
from tests.helpers import Processes, generation, recovered_by, wait_until, write_prompts
from tests.s3_support import ACCESS_KEY, SECRET_KEY, FaultProxy, MotoServer, aws_env

MODEL = "Qwen/Qwen3-8B"
Owners = dict[bytes, bytes]


def enqueue(procs: Processes, inp: Path, out: str, *extra: str) -> Any:
    return procs.run(
        "dflash_tasks.producer.enqueue",
        *("--input", str(inp), "--output", out, "--model", MODEL, "--no-preflight", *extra),
        timeout=120,
    )


def verify(procs: Processes, inp: Path, out: str) -> tuple[int, dict[str, Any]]:
    res = procs.run("dflash_tasks.output.verify", "--input", str(inp), "--output", out, "--json")
    return res.returncode, json.loads(res.stdout.strip().splitlines()[-1])


def last_json(stdout: str) -> dict[str, Any]:
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def objects(moto: MotoServer, bucket: str, prefix: str = "") -> dict[str, bytes]:
    client = moto.client()
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", ())
    ]
    return {k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def output_count(moto: MotoServer, bucket: str, prefix: str) -> int:
    page = moto.client().list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/outputs/")
    return int(page.get("KeyCount", 0))


def records(blobs: dict[str, bytes]) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for key, data in sorted(blobs.items())
        if "/outputs/" in key
        for line in data.splitlines()
        if line.strip()
    ]


def assert_no_secret(*texts: str | bytes, folder: Path | None = None) -> None:
    for text in texts:
        blob = text.encode() if isinstance(text, str) else text
        assert SECRET_KEY.encode() not in blob
    for path in folder.rglob("*") if folder else ():
        if path.is_file():
            assert SECRET_KEY.encode() not in path.read_bytes(), path


def test_job_to_s3_end_to_end_then_a_corrupted_object_fails_verify(
    procs: Processes, tmp_path: Path, moto: MotoServer
) -> None:
    bucket, prefix = moto.new_bucket(), "runs/job1"
    out = f"s3://{bucket}/{prefix}"
    procs.env.update(aws_env(moto.url, via="DFLASH_S3_ENDPOINT_URL"))
    inp = tmp_path / "prompts.jsonl"
    bad = write_prompts(inp, 300, bad_every=41)
    sim = procs.simulator("--time-scale", "0.001")
    procs.worker(sim, "gpu0")
    started = time.monotonic()
    res = enqueue(procs, inp, out, "--chunk-size", "25", "--wait", "--json")
    seconds = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    summary = last_json(res.stdout)
    assert summary["output"] == out and summary["chunks_done"] == summary["chunks"] == 12
    print(f"\n{summary['samples']} samples, {summary['chunks']} chunks to S3 in {seconds:.1f}s")

    rc, report = verify(procs, inp, out)
    assert rc == 0 and report["ok"] == 300 - bad and report["invalid"] == bad, report
    blobs = objects(moto, bucket)
    assert sorted({k.rsplit("/", 1)[0] for k in blobs}) == [prefix, f"{prefix}/inputs", f"{prefix}/outputs"]
    top = {k.rsplit("/", 1)[1] for k in blobs if "/outputs/" not in k and "/inputs/" not in k}
    assert {"invalid.jsonl", "job.json", "manifest.json"} <= top
    assert not [k for k in blobs if k.rsplit("/", 1)[1].startswith(".")]  # no probe, no temp objects
    recs = records(blobs)
    assert len(recs) == len({r["id"] for r in recs}) == 300 - bad
    head = moto.client().head_object(Bucket=bucket, Key=f"{prefix}/outputs/chunk-000000.jsonl")
    assert len(head["Metadata"]["sha256"]) == 64
    job_id = str(summary["job_id"])
    registered = Bookkeeping.from_url(procs.broker_url, f"t-{procs.queue}").job_info(job_id)
    assert registered["output"] == out  # what workers get: the URI, no endpoint, no credentials

    again = enqueue(procs, inp, out, "--chunk-size", "25", "--json")
    assert again.returncode == 0 and last_json(again.stdout)["chunks_enqueued"] == 0, again.stderr

    key = f"{prefix}/outputs/chunk-000004.jsonl"
    meta = moto.client().head_object(Bucket=bucket, Key=key)["Metadata"]
    body = blobs[key]
    moto.client().put_object(Bucket=bucket, Key=key, Body=body[: len(body) // 2], Metadata=meta)
    res_verify = procs.run("dflash_tasks.output.verify", "--input", str(inp), "--output", out)
    assert res_verify.returncode == 1
    assert f"{out}/outputs/chunk-000004.jsonl is corrupted" in res_verify.stdout, res_verify.stdout
    rc, report = verify(procs, inp, out)
    assert rc == 1 and report["corrupted"] == 1 and report["missing"] == 25

    assert_no_secret(
        res.stdout, res.stderr, again.stdout, again.stderr, res_verify.stdout, res_verify.stderr,
        json.dumps(registered), *blobs.values(), folder=tmp_path,
    )  # fmt: skip


def test_s3_faults_lose_nothing_and_duplicate_nothing(
    procs: Processes, tmp_path: Path, moto: MotoServer, proxy: FaultProxy
) -> None:
    bucket, prefix = moto.new_bucket(), "faulty"
    out = f"s3://{bucket}/{prefix}"
    procs.env.update(aws_env(proxy.url))  # AWS_ENDPOINT_URL, read by boto3 itself
    proxy.inject("slowdown", 2, method="PUT", path_contains="/inputs/", every=3)
    proxy.inject("slowdown", 3, method="PUT", path_contains="/outputs/", every=2)
    proxy.inject("reset", 2, method="PUT", path_contains="/outputs/", every=2)
    proxy.inject("reset_after_forward", 2, method="PUT", path_contains="/outputs/")
    proxy.inject("internal", 3, method="GET", path_contains="/inputs/", every=2)
    proxy.inject("truncate", 2, method="GET", path_contains="/inputs/")
    proxy.inject("internal", 3, method="HEAD", path_contains="/outputs/", every=3)
    proxy.inject("slowdown", 1, method="GET", path_contains="list-type=2")
    inp = tmp_path / "prompts.jsonl"
    write_prompts(inp, 240)
    sim = procs.simulator("--time-scale", "0.001")
    procs.worker(sim, "gpu0", "--max-chunks", "4")
    res = enqueue(procs, inp, out, "--chunk-size", "20", "--wait", "--json")
    assert res.returncode == 0, res.stderr
    rc, report = verify(procs, inp, out)
    assert rc == 0 and report["ok"] == 240 and report["duplicated"] == 0 and report["missing"] == 0, report
    fired = proxy.fired
    assert set(fired) == {"slowdown", "reset", "reset_after_forward", "internal", "truncate"}, fired
    recs = records(objects(moto, bucket))
    assert len(recs) == len({r["id"] for r in recs}) == 240
    puts = [s for s in proxy.seen if s.method == "PUT" and "/outputs/" in s.path]
    assert puts and all("x-amz-checksum-sha256" in s.headers for s in puts)
    assert not [s for s in proxy.seen if s.method == "POST"]  # no multipart uploads
    assert_no_secret(res.stdout, res.stderr, folder=tmp_path)
    print(f"\nfaults injected: {dict(fired)}; {len(proxy.seen)} requests through the proxy")


def test_worker_sigkill_mid_chunk_then_resume_to_s3(
    procs: Processes, tmp_path: Path, moto: MotoServer
) -> None:
    bucket, prefix = moto.new_bucket(), "killed"
    out = f"s3://{bucket}/{prefix}"
    procs.env.update(aws_env(moto.url))
    inp = tmp_path / "prompts.jsonl"
    write_prompts(inp, 160)
    sim = procs.simulator("--time-scale", "0.01", "--mean-output-tokens", "1500")
    victim = procs.worker(sim, "victim")
    procs.worker(sim, "survivor")
    res = enqueue(procs, inp, out, "--chunk-size", "20", "--json")
    assert res.returncode == 0, res.stderr
    job_id = str(last_json(res.stdout)["job_id"])
    owners_key = f"t-{procs.queue}:job:{job_id}:owners"
    r = redis.Redis.from_url(procs.broker_url)
    held = wait_until(
        lambda: [int(c) for c, o in cast(Owners, r.hgetall(owners_key)).items() if o.startswith(b"victim@")],
        30,
        "victim lease",
    )
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    stored = set(objects(moto, bucket, f"{prefix}/outputs/"))
    lost = {c for c in held if f"{prefix}/outputs/chunk-{c:06d}.jsonl" not in stored}
    # Resume as documented: re-run enqueue. Chunks the victim leased come back when their leases
    # expire (the survivor's reconciler); chunks it had reserved but not yet leased, by the re-plan.
    resumed = enqueue(procs, inp, out, "--chunk-size", "20", "--wait", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert last_json(resumed.stdout)["chunks_done"] == 8 == output_count(moto, bucket, prefix)
    rc, report = verify(procs, inp, out)
    assert rc == 0 and report["ok"] == 160 and report["duplicated"] == 0, report
    blobs = objects(moto, bucket, f"{prefix}/outputs/")
    for chunk in held:
        first = json.loads(blobs[f"{prefix}/outputs/chunk-{chunk:06d}.jsonl"].splitlines()[0])
        assert first["worker"].startswith("survivor@"), (chunk, first["worker"])
    # A lost chunk comes back by the survivor's reconciler (its lease expired) or, when the resume's
    # planner finds the lease expired first, by the resume itself, which claims it and queues it
    # again (no worker logs that): every lost chunk without a worker's event is one the resume queued.
    by = recovered_by(tmp_path, job_id)
    assert all(by[c] <= {"lease_expired", "unleased_delivery", "replan"} for c in lost if c in by), by
    by_resume = {c for c in lost if c not in by}
    assert len(by_resume) <= last_json(resumed.stdout)["chunks_enqueued"], (sorted(lost), by)
    gen = generation(inp, [sim])
    assert gen.ungenerated == 0 and gen.wasted <= 20 * len(held), gen


def test_bad_bucket_or_credentials_fail_enqueue_before_anything_is_queued(
    procs: Processes, tmp_path: Path, moto: MotoServer, proxy: FaultProxy
) -> None:
    inp = tmp_path / "prompts.jsonl"
    write_prompts(inp, 30)
    r = redis.Redis.from_url(procs.broker_url)
    bucket = moto.new_bucket()
    base_env = dict(procs.env)

    def attempt(out: str, env: dict[str, str]) -> str:
        procs.env = {**base_env, **env}
        res = enqueue(procs, inp, out, "--chunk-size", "10")
        assert res.returncode == 2, (res.returncode, res.stderr)
        assert res.stderr.startswith("error: ") and "Traceback" not in res.stderr, res.stderr
        assert SECRET_KEY not in res.stderr + res.stdout
        assert r.llen(procs.queue) == 0 and not r.keys(f"t-{procs.queue}:*")
        return str(res.stderr)

    missing = attempt("s3://no-such-bucket-dflash/x", aws_env(moto.url))
    assert "S3 bucket 'no-such-bucket-dflash' does not exist" in missing

    proxy.deny(ACCESS_KEY)
    denied = attempt(f"s3://{bucket}/x", aws_env(proxy.url))
    assert f"access to S3 bucket '{bucket}' denied: InvalidAccessKeyId (HTTP 403)" in denied
    proxy.clear()

    no_creds = {**aws_env(moto.url), "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    nothing = attempt(f"s3://{bucket}/x", no_creds)
    assert f"no usable AWS credentials for bucket '{bucket}'" in nothing

    proxy.inject("forbidden", 100, method="PUT")  # read-only credentials: only the probe finds out
    read_only = attempt(f"s3://{bucket}/x", aws_env(proxy.url))
    assert f"access to S3 bucket '{bucket}' denied: AccessDenied (HTTP 403)" in read_only
    assert "writing s3://" in read_only
    assert objects(moto, bucket) == {}  # nothing staged
