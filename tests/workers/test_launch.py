"""The command lines the node launcher builds (workers/node/launch.py). Whether SGLang accepts
them is checked against the pinned release's own CLI in tests/deploy/test_sglang_release.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_tasks.core.errors import ConfigError
from tests.model_configs import QWEN3_8B, QWEN36_27B, write_model
from workers.node.launch import (
    GpuPlan,
    NodeOptions,
    merge_flags,
    parse_gpus,
    plan_node,
    sglang_command,
    split_args,
)
from workers.node.main import main as node_main
from workers.node.profiles import NEXTN, choose_profile

MODEL = "/dev/shm/models/Qwen3.6-27B"
MTP_PROFILE = choose_profile(MODEL, QWEN36_27B)


def flag(argv: tuple[str, ...] | list[str], name: str) -> str:
    """The value after the last occurrence of ``name`` (what argparse would keep)."""
    idx = max(i for i, a in enumerate(argv) if a == name)
    return argv[idx + 1]


def plans(**kw: object) -> list[GpuPlan]:
    opts = {
        "gpus": (0, 1, 2),
        "model_path": MODEL,
        "python": "/venv/bin/python",
        "model_config": QWEN36_27B,
        **kw,
    }
    return plan_node(NodeOptions(**opts), {"PATH": "/usr/bin", "DFLASH_QUEUE": "q"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("0-6", (0, 1, 2, 3, 4, 5, 6)),
        ("0,2,5", (0, 2, 5)),
        ("4", (4,)),
        (" 0-1, 3 ", (0, 1, 3)),
        ("0-3,6", (0, 1, 2, 3, 6)),
        ("5,1", (1, 5)),
    ],
)
def test_parse_gpus(spec: str, expected: tuple[int, ...]) -> None:
    assert parse_gpus(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "--gpus is required"),
        ("6-0", "runs backwards"),
        ("0,x", "'x' is not a GPU index"),
        ("-1", "'-1' is not a GPU index"),
        ("0,,1", "'' is not a GPU index"),
        ("0-2,1", "GPU 1 listed twice"),
        ("0-", "'0-' is not a GPU index"),
        ("gpu0", "'gpu0' is not a GPU index"),
    ],
)
def test_parse_gpus_rejects_bad_input_clearly(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match="--gpus") as info:
        parse_gpus(spec)
    assert message in str(info.value)


def test_sglang_command_has_mtp_reasoning_and_metrics() -> None:
    argv = sglang_command("python", MODEL, 30003, 48, profile=MTP_PROFILE)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert flag(argv, "--model-path") == MODEL
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--port") == "30003"
    assert flag(argv, "--reasoning-parser") == "qwen3"
    assert flag(argv, "--speculative-algorithm") == "NEXTN"
    assert "--enable-metrics" in argv
    assert flag(argv, "--stream-interval") == "16"  # the workers stream: a chunk every 16 tokens


def test_nextn_triple_is_consistent() -> None:
    argv = sglang_command("python", MODEL, 30000, 48, profile=MTP_PROFILE)
    steps = int(flag(argv, "--speculative-num-steps"))
    topk = int(flag(argv, "--speculative-eagle-topk"))
    draft = int(flag(argv, "--speculative-num-draft-tokens"))
    # SGLang: all three or none; with top-k 1, draft tokens are forced to steps + 1.
    assert (steps, topk, draft) == (3, 1, 4)
    assert topk == 1 and draft == steps + 1
    assert (NEXTN.num_steps, NEXTN.eagle_topk, NEXTN.num_draft_tokens) == (steps, topk, draft)


def test_a_dense_model_gets_no_speculation_and_a_draft_gets_eagle3() -> None:
    for plan in plans(model_config=QWEN3_8B):
        assert not any(a.startswith("--speculative") for a in plan.server_argv)
    for plan in plans(model_config=QWEN3_8B, draft_model="/dev/shm/models/draft"):
        assert flag(plan.server_argv, "--speculative-algorithm") == "EAGLE3"
        assert flag(plan.server_argv, "--speculative-draft-model-path") == "/dev/shm/models/draft"
        assert flag(plan.server_argv, "--speculative-num-draft-tokens") == "4"
    for plan in plans(model_path="Qwen/Qwen3-8B", model_config=None):
        assert not any(a.startswith("--speculative") for a in plan.server_argv)


@pytest.mark.parametrize("inflight", [1, 48, 96])
def test_server_caps_equal_the_in_flight_target(inflight: int) -> None:
    for plan in plans(max_inflight=inflight):
        assert flag(plan.server_argv, "--max-running-requests") == str(inflight)
        assert flag(plan.server_argv, "--cuda-graph-max-bs-decode") == str(inflight)
        assert "--cuda-graph-max-bs" not in plan.server_argv  # gone in SGLang 0.5.23
        assert flag(plan.worker_argv, "--max-inflight") == str(inflight)


def test_each_gpu_gets_its_device_port_and_bound_worker() -> None:
    result = plans(gpus=(0, 2, 5), port_base=31000)
    assert [p.gpu for p in result] == [0, 2, 5]
    assert [p.port for p in result] == [31000, 31002, 31005]
    for p in result:
        assert p.env["CUDA_VISIBLE_DEVICES"] == str(p.gpu)
        assert p.env["PYTHONUNBUFFERED"] == "1"
        assert p.env["DFLASH_QUEUE"] == "q" and p.env["PATH"] == "/usr/bin"  # the rest passes through
        assert flag(p.server_argv, "--port") == str(p.port)
        assert p.endpoint == f"http://127.0.0.1:{p.port}"
        assert p.health_url == f"http://127.0.0.1:{p.port}/health_generate"
        assert p.worker_argv[:3] == ("/venv/bin/python", "-m", "workers")
        assert flag(p.worker_argv, "--endpoint") == p.endpoint
        assert flag(p.worker_argv, "--name") == f"gpu{p.gpu}"
    assert len({p.port for p in result}) == 3


def test_each_worker_gets_its_own_metrics_port() -> None:
    result = plans(gpus=(0, 3), metrics_port_base=9808)
    assert [p.env["DFLASH_METRICS_PORT"] for p in result] == ["9808", "9811"]
    assert all("DFLASH_METRICS_PORT" not in p.env for p in plans(metrics_port_base=0))
    with pytest.raises(ConfigError, match="past 65535"):
        plans(gpus=(0, 9), metrics_port_base=65530)


def test_extra_sglang_args_are_appended_and_win() -> None:
    extra = split_args(
        ["--mem-fraction-static 0.85", "--max-running-requests=64", "--served-model-name 'Qwen/Qwen3 8B'"]
    )
    assert extra == (
        "--mem-fraction-static",
        "0.85",
        "--max-running-requests=64",
        "--served-model-name",
        "Qwen/Qwen3 8B",
    )
    argv = plans(sglang_args=extra)[0].server_argv
    assert argv[-len(extra) :] == extra  # appended after ours
    assert "--max-running-requests" not in argv  # ours is dropped: the user's is the only one
    assert flag(argv, "--cuda-graph-max-bs-decode") == "48"  # the rest of ours stays
    with pytest.raises(ConfigError, match="cannot split"):
        split_args(["--x 'unterminated"])


def test_user_flags_replace_the_profiles() -> None:
    user = split_args(["--speculative-num-steps 5 --speculative-num-draft-tokens=6 --enable-metrics"])
    argv = plans(sglang_args=user)[0].server_argv
    assert argv.count("--enable-metrics") == 1
    assert flag(argv, "--speculative-algorithm") == "NEXTN"  # the profile's, not given by the user
    assert flag(argv, "--speculative-num-steps") == "5"
    assert argv.count("--speculative-num-steps") == 1
    assert "--speculative-num-draft-tokens=6" in argv and "--speculative-num-draft-tokens" not in argv
    # The user's own algorithm turns the profile's speculation off entirely.
    own = plans(sglang_args=("--speculative-algorithm", "NGRAM"))[0].server_argv
    assert [a for a in own if a.startswith("--speculative")] == ["--speculative-algorithm"]
    assert merge_flags([("--a", ("1",)), ("--b", ())], ["--a=2", "x"]) == ["--b", "--a=2", "x"]


@pytest.mark.parametrize(
    ("arg", "full"),
    [
        ("--speculative-algo", "--speculative-algorithm"),
        ("--speculative-num-draft=6", "--speculative-num-draft-tokens"),
        ("--max-running", "--max-running-requests"),
    ],
)
def test_an_abbreviation_of_a_launcher_flag_is_refused(arg: str, full: str) -> None:
    # SGLang would read it as the full flag, and the server would get ours and the user's.
    with pytest.raises(ConfigError, match=f"--sglang-arg '{arg}': .* abbreviates {full}"):
        plans(sglang_args=(arg, "x"))


def test_full_flags_and_flags_we_do_not_set_pass_the_abbreviation_check() -> None:
    argv = plans(sglang_args=("--mem-fraction-static", "0.8", "--speculative-algorithm=NGRAM"))[0].server_argv
    assert "--speculative-algorithm=NGRAM" in argv and "--mem-fraction-static" in argv


def test_node_cli_refuses_an_abbreviated_launcher_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model = write_model(tmp_path, "Qwen3.6-27B", QWEN36_27B)
    args = [
        "--print-commands",
        "--gpus",
        "0",
        "--model",
        str(model),
        "--sglang-arg",
        "--speculative-algo NGRAM",
    ]
    assert node_main(args) == 2
    err = capsys.readouterr().err
    assert "--speculative-algo abbreviates --speculative-algorithm" in err


def test_sglang_python_may_differ_from_the_workers() -> None:
    plan = plans(sglang_python="/opt/sglang/bin/python")[0]
    assert plan.server_argv[0] == "/opt/sglang/bin/python"
    assert plan.worker_argv[0] == "/venv/bin/python"


def test_simulate_runs_the_simulator_with_the_same_topology() -> None:
    result = plans(simulate=True, model_path="", sim_args=("--time-scale", "0.01"), max_inflight=8)
    for p in result:
        assert p.server_argv[1:3] == ("-m", "dflash_tasks.sim")
        assert flag(p.server_argv, "--port") == str(p.port)
        assert flag(p.server_argv, "--max-running-requests") == "8"
        assert p.server_argv[-2:] == ("--time-scale", "0.01")
        assert "--model" not in p.server_argv
        assert p.env["CUDA_VISIBLE_DEVICES"] == str(p.gpu)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"model_path": ""}, "--model is required"),
        ({"gpus": ()}, "names no GPU"),
        ({"max_inflight": 0}, "--max-inflight must be >= 1"),
        ({"port_base": 65530, "gpus": (0, 7)}, "GPU 7 would get port 65537"),
    ],
)
def test_plan_rejects(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        plans(**kw)
    assert message in str(info.value)


def test_node_cli_print_commands_and_env_defaults(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model = write_model(tmp_path, "Qwen3.6-27B", QWEN36_27B)
    monkeypatch.setenv("DFLASH_GPUS", "1,3")
    monkeypatch.setenv("DFLASH_MODEL_PATH", str(model))
    monkeypatch.setenv("DFLASH_PORT_BASE", "32000")
    monkeypatch.setenv("DFLASH_SGLANG_ARGS", "--context-length 40960")
    monkeypatch.setenv("DFLASH_METRICS_PORT", "9900")
    assert node_main(["--print-commands", "--sglang-arg", "--mem-fraction-static 0.8"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        "# profile mtp: Qwen3_5ForConditionalGeneration with MTP layers "
        "(text_config.mtp_num_hidden_layers=1): NEXTN 3/1/4 on the model's own MTP head"
    )
    assert "CUDA_VISIBLE_DEVICES=1 " in out and "CUDA_VISIBLE_DEVICES=3 " in out
    assert "--port 32001" in out and "--port 32003" in out
    assert "--speculative-algorithm NEXTN --speculative-num-steps 3" in out
    assert "--endpoint http://127.0.0.1:32003 --name gpu3" in out
    assert "--enable-metrics --stream-interval 16 --context-length 40960 --mem-fraction-static 0.8" in out
    assert "CUDA_VISIBLE_DEVICES=3 DFLASH_METRICS_PORT=9903 " in out


def test_node_cli_says_which_profile_and_why(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dense = write_model(tmp_path, "Qwen3-8B", QWEN3_8B)
    assert node_main(["--print-commands", "--gpus", "0", "--model", str(dense)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# profile none: Qwen3ForCausalLM has no MTP head in SGLang 0.5.23")
    assert "--speculative" not in out
    args = ["--print-commands", "--gpus", "0", "--model", str(dense), "--draft-model", "/d/eagle3"]
    assert node_main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("# profile eagle3: draft model /d/eagle3 given")
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path /d/eagle3" in out
    assert node_main(["--print-commands", "--gpus", "0", "--model", "Qwen/Qwen3-8B"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# profile none: no local config.json (Qwen/Qwen3-8B looks like a hub id")
    assert "--speculative" not in out.split("\n", 1)[1]  # the note names the flag; no line has it


def test_node_cli_refuses_a_model_directory_without_a_readable_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert node_main(["--print-commands", "--gpus", "0", "--model", str(empty)]) == 2
    assert f"{empty}/config.json is missing" in capsys.readouterr().err
    (empty / "config.json").write_text("{not json")
    assert node_main(["--print-commands", "--gpus", "0", "--model", str(empty)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    (empty / "config.json").write_text(json.dumps({"architectures": "Qwen3ForCausalLM"}))
    assert node_main(["--print-commands", "--gpus", "0", "--model", str(empty)]) == 2
    assert "'architectures' must be a list of names" in capsys.readouterr().err


def test_node_cli_reports_bad_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert node_main(["--gpus", "2-0", "--simulate"]) == 2
    assert "runs backwards" in capsys.readouterr().err


def test_auto_caps_every_server_at_the_tuners_ceiling_and_its_worker_tunes_below_it() -> None:
    for plan in plans(tune_inflight=True):
        assert flag(plan.server_argv, "--max-running-requests") == "256"
        assert flag(plan.server_argv, "--cuda-graph-max-bs-decode") == "256"
        assert flag(plan.worker_argv, "--max-inflight") == "auto"
        assert flag(plan.worker_argv, "--inflight-ceiling") == "256"
    (plan,) = plans(gpus=(0,), tune_inflight=True, inflight_ceiling=160)
    assert flag(plan.server_argv, "--max-running-requests") == "160"
    assert flag(plan.worker_argv, "--inflight-ceiling") == "160"


def test_under_auto_a_users_running_request_cap_is_the_ceiling_and_print_commands_says_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (plan,) = plans(gpus=(0,), tune_inflight=True, sglang_args=("--max-running-requests", "96"))
    assert plan.server_argv.count("--max-running-requests") == 1
    assert flag(plan.server_argv, "--max-running-requests") == "96"
    assert flag(plan.server_argv, "--cuda-graph-max-bs-decode") == "96"
    assert flag(plan.worker_argv, "--inflight-ceiling") == "96"
    model = write_model(tmp_path, "Qwen3-8B", QWEN3_8B)
    argv = ["--gpus", "0", "--model", str(model), "--max-inflight", "auto", "--print-commands"]
    assert node_main([*argv, "--sglang-arg", "--max-running-requests 96"]) == 0
    out = capsys.readouterr().out
    assert "# in flight: tuned per GPU from 48, at most 96; servers capped at 96 running requests " in out
    assert "(your --sglang-arg --max-running-requests)" in out
    assert node_main(["--gpus", "0", "--model", str(model), "--max-inflight", "48", "--print-commands"]) == 0
    assert "# in flight: 48 fixed; servers capped at 48" in capsys.readouterr().out


def test_the_launcher_tunes_by_default_and_a_number_or_the_environment_pins_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = write_model(tmp_path, "Qwen3-8B", QWEN3_8B)
    argv = ["--gpus", "0", "--model", str(model), "--print-commands"]
    assert node_main(argv) == 0
    out = capsys.readouterr().out
    assert "# in flight: tuned per GPU from 48, at most 256; servers capped at 256 running requests " in out
    assert "--max-inflight auto --inflight-ceiling 256" in out
    assert node_main([*argv, "--max-inflight", "48"]) == 0
    assert "# in flight: 48 fixed; servers capped at 48" in capsys.readouterr().out
    monkeypatch.setenv("DFLASH_TUNE_INFLIGHT", "0")
    assert node_main(argv) == 0
    assert "# in flight: 48 fixed; servers capped at 48" in capsys.readouterr().out


def test_a_bad_max_inflight_is_refused_with_the_values_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        node_main(["--gpus", "0", "--model", "m", "--max-inflight", "lots", "--print-commands"])
    assert exc.value.code == 2
    assert "'lots' is not a valid int: a number of requests or 'auto'" in capsys.readouterr().err
