"""The model matching rule (docs/routing.md) and the refusal of unusable job model names."""

from __future__ import annotations

import pytest

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.model_name import check_model_name, model_key, server_keys, serves


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("Qwen/Qwen3-8B", "qwen3-8b"),
        ("Qwen3-8B", "qwen3-8b"),
        ("/dev/shm/models/Qwen3.6-27B", "qwen3.6-27b"),
        ("/dev/shm/models/Qwen3.6-27B/", "qwen3.6-27b"),
        ("  Qwen3-8B  ", "qwen3-8b"),
        ("deepseek-ai/DeepSeek-V3_0324", "deepseek-v3_0324"),
        ("my model+v2", "my-model-v2"),
        ("", ""),
        ("/", ""),
    ],
)
def test_model_key(name: str, key: str) -> None:
    assert model_key(name) == key


# (job --model, server served_model_name, server model_path, matches)
CASES = [
    # the README's setup: a path served under its own name, the job names the last component
    ("Qwen3.6-27B", "/dev/shm/models/Qwen3.6-27B", "/dev/shm/models/Qwen3.6-27B", True),
    # a hub id job against a staged copy, and against the hub id itself
    ("Qwen/Qwen3-8B", "/dev/shm/models/Qwen3-8B", "/dev/shm/models/Qwen3-8B", True),
    ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B", True),
    ("Qwen3-8B", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B", True),
    # --served-model-name: the alias matches, and so does the path's last component
    ("qwen-27b", "qwen-27b", "/dev/shm/models/Qwen3.6-27B", True),
    ("Qwen3.6-27B", "qwen-27b", "/dev/shm/models/Qwen3.6-27B", True),
    # case does not matter
    ("qwen3-8b", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B", True),
    # another model, even one whose name contains the job's
    ("Qwen3-8B", "/dev/shm/models/Qwen3.6-27B", "/dev/shm/models/Qwen3.6-27B", False),
    ("Qwen3-8B", "Qwen/Qwen3-8B-FP8", "Qwen/Qwen3-8B-FP8", False),
    ("Qwen/Qwen3-8B", "Qwen/Qwen3-32B", "/models/Qwen3-32B", False),
    # a server that has not said what it serves matches nothing
    ("Qwen3-8B", "", "", False),
    ("", "", "", False),
]


@pytest.mark.parametrize(("job", "served", "path", "expected"), CASES)
def test_matching_rule(job: str, served: str, path: str, expected: bool) -> None:
    assert serves(job, served, path) is expected


def test_a_server_serves_the_keys_of_its_name_and_path() -> None:
    assert server_keys("qwen-27b", "/dev/shm/models/Qwen3.6-27B") == {"qwen-27b", "qwen3.6-27b"}
    assert server_keys("Qwen/Qwen3-8B", "Qwen/Qwen3-8B") == {"qwen3-8b"}
    assert server_keys("", "") == frozenset()


@pytest.mark.parametrize("model", ["Qwen/Qwen3-8B", "Qwen3.6-27B", "/dev/shm/models/Qwen3-8B"])
def test_usable_names_pass(model: str) -> None:
    check_model_name(model)


def test_a_colon_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError) as err:
        check_model_name("Qwen/Qwen3-8B:my-lora")
    text = str(err.value)
    assert "'Qwen/Qwen3-8B:my-lora'" in text and "LoRA adapter" in text and "HTTP 400" in text


@pytest.mark.parametrize(("model", "why"), [("", "is required"), ("  ", "is required"), ("//", "names no")])
def test_empty_names_are_refused(model: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        check_model_name(model)
