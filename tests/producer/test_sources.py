"""Input sources: JSONL, Parquet shards, a save_to_disk folder and S3 stage the same job; weighted
mixes; bad input named by source, file and row."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dflash_tasks.core.errors import InputError, JobMismatch
from dflash_tasks.core.job import JOB_KEY, MANIFEST_KEY
from dflash_tasks.core.sample import decode_chunk
from dflash_tasks.producer.enqueue import input_mix, prepare
from dflash_tasks.producer.enqueue_args import build_parser, options_from_args
from dflash_tasks.producer.mix import InputMix
from dflash_tasks.producer.prompt_row import ColumnMap
from dflash_tasks.producer.sources import parse_sources
from dflash_tasks.producer.staging import stage_input
from dflash_tasks.store import LocalStore
from tests.e2e.test_pipeline_e2e import enqueue_args
from tests.helpers import REPO, Processes
from tests.s3_support import MotoServer, aws_env

ROWS = 300


def rows(n: int = ROWS, tag: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        turns = [{"role": "user", "content": f"{tag}question {i}"}]
        if i % 7 == 0:  # some multi-turn conversations with an old answer
            turns += [{"role": "assistant", "content": "old"}, {"role": "user", "content": f"more {i}"}]
        out.append({"id": f"{tag}p{i}", "messages": turns})
    return out


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


def write_shards(folder: Path, items: list[dict[str, Any]], shards: int = 3) -> Path:
    folder.mkdir(parents=True)
    size = -(-len(items) // shards)
    for k in range(shards):
        table = pa.Table.from_pylist(items[k * size : (k + 1) * size])
        pq.write_table(table, folder / f"train-{k:05d}-of-{shards:05d}.parquet")
    return folder


def stage(locations: list[str], out: Path, seed: int = 0, **columns: str) -> tuple[dict[str, bytes], Any]:
    mix = InputMix(parse_sources(locations, ColumnMap(**columns)), seed)
    report = stage_input(mix, LocalStore(out), "job", 64)
    staged = {p.name: p.read_bytes() for p in sorted((out / "inputs").iterdir())}
    return staged, report


def test_jsonl_parquet_shards_save_to_disk_and_s3_stage_identical_records(
    tmp_path: Path, moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets  # a dev dependency (the runtime reads the folder with pyarrow alone)

    items = rows()
    jsonl = write_jsonl(tmp_path / "prompts.jsonl", items)
    shards = write_shards(tmp_path / "shards", items)
    datasets.Dataset.from_list(items).save_to_disk(str(tmp_path / "hf"), num_shards=2)
    bucket = moto.new_bucket("inputs")
    client = moto.client()
    for shard in sorted(shards.iterdir()):
        client.upload_file(str(shard), bucket, f"data/{shard.name}")
    for key, value in aws_env(moto.url).items():
        monkeypatch.setenv(key, value)

    expected, report = stage([str(jsonl)], tmp_path / "o-jsonl")
    assert report.manifest.samples == ROWS and report.manifest.chunks == 5
    for name, location in {
        "shards": str(shards),
        "glob": str(shards / "*.parquet"),
        "hf": str(tmp_path / "hf"),
        "s3": f"s3://{bucket}/data",
        "s3-glob": f"s3://{bucket}/data/train-*.parquet",
    }.items():
        staged, other = stage([location], tmp_path / f"o-{name}")
        assert staged == expected, name
        assert other.manifest == report.manifest, name
    first = decode_chunk(expected["chunk-000000.jsonl"])
    assert (first[0].id, first[0].line, first[0].source) == ("p0", 1, None)


def big_table(rows: int = 30_000) -> pa.Table:
    """``rows`` prompts of 2 KB of incompressible text: ~58 MB."""
    pad = random.Random(0)
    return pa.Table.from_pylist([{"id": f"p{i}", "prompt": pad.randbytes(1000).hex()} for i in range(rows)])


#: Run in a fresh process: read the file, print the rows, Arrow's peak allocation and how much the
#: resident memory grew, in MB (the libraries are loaded first, so that only the reading counts).
_READ_AND_MEASURE = """
import sys, pyarrow as pa, pyarrow.parquet
from dflash_tasks.producer.mix import read_input
def kb(field): return int(open("/proc/self/status").read().split(field + ":")[1].split()[0])
before = kb("VmRSS")
n = sum(1 for _ in read_input(sys.argv[1]))
print(n, pa.default_memory_pool().max_memory() / 2**20, (kb("VmHWM") - before) / 1024)
"""


def read_and_measure(path: Path) -> tuple[int, float, float]:
    """(rows, Arrow's peak MB, resident memory grown MB) of reading ``path`` in a fresh process."""
    res = subprocess.run(
        [sys.executable, "-c", _READ_AND_MEASURE, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    rows_read, arrow_mb, grown_mb = res.stdout.split()
    return int(rows_read), float(arrow_mb), float(grown_mb)


def test_a_parquet_row_group_is_read_a_batch_at_a_time_not_whole(tmp_path: Path) -> None:
    table = big_table()
    path = tmp_path / "one-row-group.parquet"
    pq.write_table(table, path, row_group_size=len(table), compression="none")
    size_mb = path.stat().st_size / 2**20
    rows_read, arrow_mb, _ = read_and_measure(path)
    assert rows_read == len(table)
    # A batch of 4,096 rows is ~8 MB here: Arrow's peak is a few batches, not the row group.
    assert arrow_mb < size_mb / 2, (arrow_mb, size_mb)


def test_an_arrow_file_is_read_a_batch_at_a_time_not_mapped(tmp_path: Path) -> None:
    table = big_table()
    path = tmp_path / "data-00000-of-00001.arrow"
    with pa.ipc.new_stream(str(path), table.schema) as writer:  # as save_to_disk writes a shard
        writer.write_table(table, max_chunksize=1000)
    size_mb = path.stat().st_size / 2**20
    rows_read, _, grown_mb = read_and_measure(path)
    assert rows_read == len(table)
    # Mapped, every page read would count as the process's memory: the whole file.
    assert grown_mb < size_mb / 2, (grown_mb, size_mb)


def test_column_flags_and_a_system_prompt(tmp_path: Path) -> None:
    table = pa.Table.from_pylist([{"uid": 7, "instruction": "write a poem", "output": "..."}])
    pq.write_table(table, tmp_path / "alpaca.parquet")
    staged, _ = stage(
        [str(tmp_path / "alpaca.parquet")], tmp_path / "o", prompt="instruction", id="uid", system="be brief"
    )
    (sample,) = decode_chunk(staged["chunk-000000.jsonl"])
    assert sample.id == "7"
    assert sample.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "write a poem"},
    ]


def test_zstd_jsonl_reads_like_plain(tmp_path: Path) -> None:
    plain = write_jsonl(tmp_path / "p.jsonl", rows(50))
    with pa.output_stream(str(tmp_path / "p.jsonl.zst"), compression="zstd") as fh:
        fh.write(plain.read_bytes())
    assert stage([str(plain)], tmp_path / "a")[0] == stage([str(tmp_path / "p.jsonl.zst")], tmp_path / "b")[0]


def test_weighted_mix_takes_rows_by_weight_and_names_each_source(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", rows(3000, "a"))
    b = write_shards(tmp_path / "b", rows(2000, "b"), shards=2)
    staged, report = stage([f"{a},weight=1", f"{b},name=code,weight=3"], tmp_path / "o", seed=5)
    # The mix is as large as its sources allow: b (2000 rows, 3/4) sets it, a gives a quarter.
    figures = {f["name"]: f for f in report.manifest.sources}
    assert (figures["a"]["samples"], figures["code"]["samples"]) == (667, 2000)
    assert figures["a"]["rows"] == 3000 and figures["a"]["first_chunk"] == 0
    samples = [s for data in staged.values() for s in decode_chunk(data)]
    assert [s.line for s in samples] == list(range(1, 2668))
    assert {s.source for s in samples} == {"a", "code"}
    assert samples[0].id.startswith("a:ap") and samples[-1].id == "code:bp1999"
    chosen = [int(s.id.removeprefix("a:ap")) for s in samples if s.source == "a"]
    # Chosen uniformly over the whole source: each third of it holds about a third of the rows.
    thirds = [sum(1 for r in chosen if k * 1000 <= r < (k + 1) * 1000) for k in range(3)]
    assert all(abs(t - 667 / 3) < 4 * (667 * (1 / 3) * (2 / 3)) ** 0.5 for t in thirds), thirds
    again, _ = stage([f"{a},weight=1", f"{b},name=code,weight=3"], tmp_path / "o2", seed=5)
    assert again == staged  # the same command stages the same rows
    other, _ = stage([f"{a},weight=1", f"{b},name=code,weight=3"], tmp_path / "o3", seed=6)
    assert other != staged


def test_a_limit_takes_that_many_rows(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", rows(500))
    _, report = stage([f"{a},limit=120"], tmp_path / "o")
    assert report.manifest.samples == 120 and report.manifest.lines == 120


def parse(*argv: str) -> Any:
    return build_parser().parse_args([*argv, "--model", "m"])


def test_a_rerun_with_another_weight_is_refused_naming_it(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", rows(100, "a"))
    b = write_jsonl(tmp_path / "b.jsonl", rows(100, "b"))
    out = str(tmp_path / "out")
    args = parse("--input", f"{a},weight=1", "--input", f"{b},weight=2", "--output", out)
    job, store, existing, _ = prepare(options_from_args(args))
    assert existing is None and job.inputs is not None
    store.write(JOB_KEY, job.to_json())
    assert prepare(options_from_args(args))[0] == job  # the same command: the same job
    changed = parse("--input", f"{a},weight=1", "--input", f"{b},weight=3", "--output", out)
    with pytest.raises(JobMismatch, match=r"source 'b' weight: the output has 2.0, this run asks for 3.0"):
        prepare(options_from_args(changed))
    dropped = parse("--input", f"{a},weight=1", "--output", out)
    with pytest.raises(JobMismatch, match=r"source 'b': the output has it, this run does not read it"):
        prepare(options_from_args(dropped))


def test_a_job_of_one_jsonl_file_keeps_its_identity(tmp_path: Path) -> None:
    from dflash_tasks.core.job import JobDefinition
    from dflash_tasks.producer.enqueue_args import quality_from_args, spec_from_args
    from dflash_tasks.producer.inputs import input_fingerprint

    a = write_jsonl(tmp_path / "a.jsonl", rows(10))
    args = parse("--input", str(a), "--output", str(tmp_path / "out"))
    before = JobDefinition.create(
        input_fingerprint(a), "a.jsonl", spec_from_args(args), quality_from_args(args)
    )
    job = prepare(options_from_args(args))[0]
    assert job.job_id == before.job_id and job.inputs is None
    assert b'"inputs"' not in job.to_json()


def test_a_bad_row_names_source_file_and_row(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", rows(5, "a"))
    table = pa.Table.from_pylist([{"messages": [{"role": "user", "content": "ok"}]}, {"messages": []}])
    pq.write_table(table, tmp_path / "b.parquet")
    _, report = stage([str(a), str(tmp_path / "b.parquet")], tmp_path / "o")
    (bad,) = report.invalid
    assert (bad.source, bad.file, bad.line) == ("b", str(tmp_path / "b.parquet"), 2)
    assert "empty prompt" in bad.reason
    lines = (tmp_path / "o" / "invalid.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["source"] == "b"


def test_a_missing_column_names_the_columns_there_are(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "a"}]), tmp_path / "qa.parquet")
    with pytest.raises(
        InputError, match=r"qa.parquet: none of the columns .*--prompt-column.*columns are: question, answer"
    ):
        stage([str(tmp_path / "qa.parquet")], tmp_path / "o")
    with pytest.raises(
        InputError, match=r"no column 'instruction' \(--prompt-column\); its columns are: question"
    ):
        stage([str(tmp_path / "qa.parquet")], tmp_path / "o2", prompt="instruction")


def test_an_unreadable_shard_stops_staging_by_name_and_keeps_what_was_staged(tmp_path: Path) -> None:
    shards = write_shards(tmp_path / "shards", rows(300), shards=3)
    broken = sorted(shards.iterdir())[1]
    data = broken.read_bytes()
    broken.write_bytes(data[:4] + b"\0" * 200 + data[204:])  # its first pages destroyed, footer intact
    out = tmp_path / "o"
    with pytest.raises(InputError, match=f"^{broken}: cannot read this parquet file"):
        stage([str(shards)], out)
    assert sorted(p.name for p in (out / "inputs").iterdir())[:1] == ["chunk-000000.jsonl"]
    assert not (out / MANIFEST_KEY).exists()  # a re-run stages again; nothing staged was lost


def test_a_file_that_breaks_off_in_a_job_of_several_sources_names_source_file_and_line(
    tmp_path: Path,
) -> None:
    import gzip

    a = write_jsonl(tmp_path / "a.jsonl", rows(100, "a"))
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in rows(3000, "b")).encode())
    (tmp_path / "b.jsonl.gz").write_bytes(data[: len(data) // 2])  # cut off halfway
    out = tmp_path / "o"
    with pytest.raises(InputError) as info:
        stage([str(a), f"{tmp_path / 'b.jsonl.gz'},name=chat"], out)
    message = str(info.value)
    assert message.startswith(
        f"source 'chat': {tmp_path / 'b.jsonl.gz'}: gzip stream is corrupt or truncated after line "
    )
    assert int(message.split("after line ")[1].split(":")[0]) > 0
    assert (out / "inputs" / "chunk-000000.jsonl").exists() and not (out / MANIFEST_KEY).exists()


@pytest.mark.parametrize(
    ("content", "what", "option"),
    [
        ("parquet", "a Parquet file", "format=parquet"),
        ("arrow", "an Arrow IPC file", "format=arrow"),
        ("zip", "a zip archive", "unpack it"),
    ],
)
def test_a_file_of_another_format_is_named_with_the_option_that_reads_it(
    tmp_path: Path, content: str, what: str, option: str
) -> None:
    path = tmp_path / "prompts.jsonl"
    table = pa.Table.from_pylist(rows(3))
    if content == "parquet":
        pq.write_table(table, path)
    elif content == "arrow":
        with pa.ipc.new_file(str(path), table.schema) as writer:
            writer.write_table(table)
    else:
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("prompts.jsonl", "{}")
    with pytest.raises(InputError, match=f"this is {what}, not jsonl: .*{option}"):
        stage([str(path)], tmp_path / "o")


def test_enqueue_of_parquet_given_as_jsonl_or_without_a_valid_sample_exits_non_zero(
    procs: Processes, tmp_path: Path
) -> None:
    parquet = tmp_path / "prompts.jsonl"
    pq.write_table(pa.Table.from_pylist(rows(20)), parquet)
    res = procs.run(
        "dflash_tasks.producer.enqueue", *enqueue_args(parquet, tmp_path / "o1", "--no-preflight")
    )
    assert res.returncode == 2, res.stderr
    assert (
        f"{parquet}: this is a Parquet file, not jsonl: read it with --input {parquet},format=parquet"
        in res.stderr
    )
    assert not (tmp_path / "o1" / MANIFEST_KEY).exists()

    junk = write_jsonl(tmp_path / "junk.jsonl", [{"text": "no prompt here"}])
    out = tmp_path / "o2"
    res = procs.run("dflash_tasks.producer.enqueue", *enqueue_args(junk, out, "--no-preflight"))
    assert res.returncode == 2, res.stderr
    assert "no valid sample in the input: 1 invalid line" in res.stderr
    assert f"{junk}:1: unknown shape" in res.stderr
    assert not (out / JOB_KEY).exists()  # a fixed input defines the job afresh

    ok = procs.run(  # the same file given with its format is read
        "dflash_tasks.producer.enqueue",
        "--input",
        f"{parquet},format=parquet",
        *enqueue_args(parquet, tmp_path / "o4", "--no-preflight", "--json")[2:],
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])["samples"] == 20


def test_input_mix_from_flags(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", rows(3))
    args = parse("--input", f"{a},prompt=q,id=k", "--messages-column", "m", "--output", str(tmp_path))
    (spec,) = input_mix(options_from_args(args)).specs
    assert spec.columns == ColumnMap(messages=None, prompt="q", id="k")


def test_the_preflight_spreads_its_chunks_over_the_sources_in_proportion() -> None:
    from dflash_tasks.core.job import Manifest
    from dflash_tasks.producer.preflight import preflight_chunks

    sources = [
        {"name": "big", "samples": 6000, "first_chunk": 0, "last_chunk": 93},
        {"name": "small", "samples": 400, "first_chunk": 93, "last_chunk": 99},
    ]
    manifest = Manifest("j", 6400, 6400, 0, 64, 100, sources=sources)
    chosen = preflight_chunks(manifest, 640)  # 10 chunks: 9 of big, 1 of small at least
    assert len([c for c in chosen if c < 93]) >= 8 and any(c > 93 for c in chosen)


def test_a_record_and_a_staged_sample_keep_their_source() -> None:
    from dflash_tasks.core.record import Record
    from dflash_tasks.core.sample import Sample, encode_chunk

    sample = Sample("code:L3", [{"role": "user", "content": "x"}], 9, "code")
    assert decode_chunk(encode_chunk([sample])) == [sample]
    plain = Sample("L3", [{"role": "user", "content": "x"}], 3)
    assert b"source" not in encode_chunk([plain])  # a job of one source stages what it always did
    record = Record.from_dict({"id": "code:L3", "line": 9, "source": "code", "status": "ok", "content": "y"})
    assert record.source == "code" and Record.from_json(record.to_json()) == record
    assert '"source"' not in Record.from_dict({"id": "L3", "status": "ok", "content": "y"}).to_json()


def test_a_two_source_job_runs_verifies_and_reports_per_source(procs: Processes, tmp_path: Path) -> None:
    chat = write_jsonl(tmp_path / "chat.jsonl", rows(120, "c"))
    code = write_shards(tmp_path / "code", rows(80, "k"), shards=2)
    out = tmp_path / "out"
    inputs = ["--input", f"{chat},weight=1", "--input", f"{code},name=code,weight=1"]
    sim = procs.simulator("--time-scale", "0.001")
    procs.worker(sim, "gpu0")
    res = procs.run(
        "dflash_tasks.producer.enqueue",
        *inputs,
        *enqueue_args(chat, out, "--chunk-size", "16", "--wait", "--json", "--no-preflight")[2:],
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["samples"] == 160  # 80 + 80: code sets the size
    verified = procs.run("dflash_tasks.output.verify", *inputs, "--output", str(out), "--json")
    result = json.loads(verified.stdout.strip().splitlines()[-1])
    assert verified.returncode == 0 and result["ok"] == 160 and result["lines"] == 160, verified.stdout
    report = procs.run(
        "dflash_tasks.output.report", "--output", str(out), "--json", "--png", str(tmp_path / "r.png")
    )
    doc = json.loads(report.stdout.strip().splitlines()[-1])
    assert {name: s["samples"] for name, s in doc["sources"].items()} == {"chat": 80, "code": 80}
    assert doc["sources"]["code"]["output_tokens"] > 0
    assert abs(doc["sources"]["chat"]["cost_share"] + doc["sources"]["code"]["cost_share"] - 1) < 0.001
    assert (out / "sources.json").exists()
    status = procs.run("dflash_tasks.status", "--output", str(out), "--json")
    progress = json.loads(status.stdout.strip().splitlines()[-1])
    assert progress["sources"]["code"]["staged_samples"] == 80 and progress["sources"]["code"]["ok"] == 80
    retry = procs.run(
        "dflash_tasks.producer.enqueue",
        "--input",
        f"{chat},weight=1",
        "--input",
        f"{code},name=code,weight=2",
        *enqueue_args(chat, out, "--no-preflight")[2:],
    )
    assert (
        retry.returncode == 2
        and "source 'code' weight: the output has 1.0, this run asks for 2.0" in retry.stderr
    )
