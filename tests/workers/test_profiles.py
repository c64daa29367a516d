"""The speculative-decoding profile chosen from a model's config.json (workers/node/profiles.py).
That MTP_ARCHITECTURES is the pinned release's own set is checked in
tests/deploy/test_sglang_release.py."""

from __future__ import annotations

from typing import Any

import pytest

from dflash_tasks.core.errors import ConfigError
from tests.model_configs import DEEPSEEK_V3, QWEN3_8B, QWEN3_30B_A3B, QWEN36_27B
from workers.node.profiles import FlagPair, ModelInfo, choose_profile, model_info

NEXTN_FLAGS: tuple[FlagPair, ...] = (
    ("--speculative-algorithm", ("NEXTN",)),
    ("--speculative-num-steps", ("3",)),
    ("--speculative-eagle-topk", ("1",)),
    ("--speculative-num-draft-tokens", ("4",)),
)


def test_an_mtp_model_with_its_layers_in_text_config_gets_nextn() -> None:
    assert model_info(QWEN36_27B) == ModelInfo(
        "Qwen3_5ForConditionalGeneration", 1, "text_config.mtp_num_hidden_layers"
    )
    profile = choose_profile("/dev/shm/models/Qwen3.6-27B", QWEN36_27B)
    assert profile.name == "mtp" and profile.flags == NEXTN_FLAGS
    assert profile.describe() == (
        "profile mtp: Qwen3_5ForConditionalGeneration with MTP layers "
        "(text_config.mtp_num_hidden_layers=1): NEXTN 3/1/4 on the model's own MTP head"
    )


def test_deepseek_v3_counts_its_nextn_layers_at_the_top_level() -> None:
    assert model_info(DEEPSEEK_V3) == ModelInfo("DeepseekV3ForCausalLM", 1, "num_nextn_predict_layers")
    profile = choose_profile("/m/DeepSeek-V3", DEEPSEEK_V3)
    assert profile.name == "mtp" and profile.flags == NEXTN_FLAGS
    assert "num_nextn_predict_layers=1" in profile.reason


def test_a_dense_model_gets_no_speculation() -> None:
    profile = choose_profile("/m/Qwen3-8B", QWEN3_8B)
    assert (profile.name, profile.flags) == ("none", ())
    assert profile.reason == (
        "Qwen3ForCausalLM has no MTP head in SGLang 0.5.23: no speculation "
        "(--draft-model PATH enables EAGLE3)"
    )


def test_an_mtp_capable_architecture_without_mtp_layers_gets_no_speculation() -> None:
    # SGLang would rename Qwen3MoeForCausalLM's draft to its MTP class and load no weights into it.
    profile = choose_profile("/m/Qwen3-30B-A3B", QWEN3_30B_A3B)
    assert (profile.name, profile.flags) == ("none", ())
    assert "can carry an MTP head, but config.json declares no MTP layers" in profile.reason
    zero = {**QWEN36_27B, "text_config": {"mtp_num_hidden_layers": 0}}  # SGLang reads 0 as absent
    assert choose_profile("/m/x", zero).name == "none"


def test_a_dense_model_with_a_draft_gets_eagle3() -> None:
    profile = choose_profile("/m/Qwen3-8B", QWEN3_8B, draft_model="/m/Qwen3-8B-EAGLE3")
    assert profile.name == "eagle3"
    assert profile.flags == (
        ("--speculative-algorithm", ("EAGLE3",)),
        ("--speculative-draft-model-path", ("/m/Qwen3-8B-EAGLE3",)),
        ("--speculative-num-steps", ("3",)),
        ("--speculative-eagle-topk", ("1",)),
        ("--speculative-num-draft-tokens", ("4",)),
    )
    # A draft given for an MTP model is the user's choice, and wins over its MTP head.
    assert choose_profile("/m/x", QWEN36_27B, draft_model="/m/d").name == "eagle3"


@pytest.mark.parametrize(
    "user",
    [("--speculative-algorithm", "NGRAM"), ("--mem-fraction-static", "0.8", "--speculative-algorithm=NGRAM")],
)
def test_the_users_speculative_algorithm_overrides_the_profile(user: tuple[str, ...]) -> None:
    profile = choose_profile("/m/x", QWEN36_27B, user_args=user)
    assert (profile.name, profile.flags) == ("user", ())
    assert "--speculative-algorithm NGRAM" in profile.reason
    with_draft = choose_profile("/m/x", QWEN3_8B, draft_model="/m/d", user_args=user)
    assert with_draft.flags == (("--speculative-draft-model-path", ("/m/d",)),)
    # Other user flags do not change the profile (they replace single flags, see test_launch.py).
    assert choose_profile("/m/x", QWEN36_27B, user_args=("--speculative-num-steps", "5")).name == "mtp"


@pytest.mark.parametrize(
    ("model", "note"),
    [
        ("Qwen/Qwen3.6-27B", "Qwen/Qwen3.6-27B looks like a hub id, which SGLang downloads itself"),
        ("/dev/shm/models/Qwen3.6-27B", "/dev/shm/models/Qwen3.6-27B is not a directory on this machine"),
    ],
)
def test_no_local_config_guesses_no_speculation_and_says_so(model: str, note: str) -> None:
    profile = choose_profile(model, None)
    assert (profile.name, profile.flags) == ("none", ())
    assert profile.reason.startswith(f"no local config.json ({note}): no speculation is guessed")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"architectures": "Qwen3ForCausalLM"}, "'architectures' must be a list of names"),
        ({"architectures": ["X"], "num_nextn_predict_layers": "1"}, "num_nextn_predict_layers: expected"),
        (
            {"architectures": ["X"], "text_config": {"mtp_num_hidden_layers": -1}},
            "text_config.mtp_num_hidden",
        ),
        ({"architectures": ["X"], "num_nextn_predict_layers": True}, "expected a layer count"),
    ],
)
def test_a_malformed_config_is_refused_naming_the_file_and_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=r"/m/x/config\.json") as info:
        choose_profile("/m/x", config)
    assert message in str(info.value)


def test_a_config_without_architectures_is_a_model_without_mtp() -> None:
    profile = choose_profile("/m/x", {"model_type": "llama"})
    assert profile.name == "none" and "(no architectures) has no MTP head" in profile.reason
