"""Loss tokens under the model's own chat template: counted by hand, and against SpecForge's rule."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.loss_tokens import LossTokenCounter, load_tokenizer, markers_of
from dflash_tasks.core.trainer_view import TrainerView
from dflash_tasks.sim.textgen import _ANSWER_WORDS, _REASONING_WORDS
from dflash_tasks.sim.tokenizer import PLAIN_TEMPLATE, QWEN3_TEMPLATE, build_model_dir


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(str(build_model_dir(tmp_path_factory.mktemp("tok"), QWEN3_TEMPLATE)))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer(str(build_model_dir(tmp_path_factory.mktemp("tok"), PLAIN_TEMPLATE, "plain")))


def msg(role: str, content: str, reasoning: str | None = None) -> dict[str, Any]:
    return {"role": role, "content": content, "reasoning_content": reasoning}


def counter(tokenizer: Any, thinking: bool = True, **view: Any) -> LossTokenCounter:
    return LossTokenCounter(tokenizer, TrainerView(**view), thinking, "test")


def test_the_words_are_single_tokens(qwen3: Any) -> None:
    # The hand counts below rely on it.
    assert qwen3.tokenize("alpha beta gamma") == ["alpha", "Ġbeta", "Ġgamma"]
    assert qwen3.tokenize("beta") == ["beta"]


def test_markers_come_from_the_template(qwen3: Any, plain: Any) -> None:
    on, off = markers_of(qwen3, True, "t"), markers_of(qwen3, False, "t")
    assert (on.assistant_header, on.end_of_turn, on.ignore) == ("<|im_start|>assistant\n", "<|im_end|>\n", ())
    assert off.ignore == ("<think>\n\n</think>\n\n",)  # SpecForge's qwen3-instruct ignore token
    bare = markers_of(plain, True, "t")
    assert (bare.assistant_header, bare.end_of_turn) == ("### assistant:\n", "<|end|>\n")


def test_one_thinking_turn_counted_by_hand(qwen3: Any) -> None:
    row = counter(qwen3).count([msg("user", "alpha"), msg("assistant", "beta gamma", "alpha beta")])
    # After "<|im_start|>assistant\n": <think> \n alpha Ġbeta \n </think> \n\n beta Ġgamma <|im_end|> \n
    assert row.loss_tokens == row.loss_tokens_untruncated == 11
    # Before it: <|im_start|> + "user\n" + alpha + <|im_end|> + \n + <|im_start|> + "assistant\n"
    assert row.tokens == 11 + len(
        qwen3.tokenize("<|im_start|>user\nalpha<|im_end|>\n<|im_start|>assistant\n")
    )
    assert (row.reasoning_turns, row.reasoning_dropped, row.truncated) == (1, 0, False)


def test_thinking_off_ignores_the_empty_think_block(qwen3: Any) -> None:
    row = counter(qwen3, thinking=False).count([msg("user", "alpha"), msg("assistant", "beta gamma", "")])
    assert row.loss_tokens == 4  # beta Ġgamma <|im_end|> \n: the seed's few-token rows look like this


def test_the_last_query_rule_drops_earlier_reasoning(qwen3: Any) -> None:
    messages = [
        msg("user", "alpha"),
        msg("assistant", "beta", "gamma delta"),
        msg("user", "delta"),
        msg("assistant", "gamma", "alpha"),
    ]
    row = counter(qwen3).count(messages)
    # turn 1 as history: beta <|im_end|> \n (3)
    # turn 2: <think> \n alpha \n </think> \n\n gamma <|im_end|> \n (9)
    assert row.loss_tokens == 3 + 9
    assert (row.reasoning_turns, row.reasoning_dropped) == (2, 1)
    assert counter(qwen3, last_turn_only=True).count(messages).loss_tokens == 9


def test_max_length_cuts_loss_tokens(qwen3: Any) -> None:
    messages = [msg("user", "alpha"), msg("assistant", "beta gamma", "alpha beta")]
    full = counter(qwen3).count(messages)
    cut = counter(qwen3, max_length=full.tokens - 5).count(messages)
    assert (cut.loss_tokens, cut.lost_to_max_length, cut.truncated) == (6, 5, True)
    assert counter(qwen3, max_length=full.tokens).count(messages).truncated is False


def test_a_plain_template_trains_on_answers_only(plain: Any) -> None:
    row = counter(plain).count([msg("user", "alpha"), msg("assistant", "beta gamma", "alpha beta")])
    assert row.loss_tokens == 2 + len(plain.tokenize("<|end|>\n"))  # beta Ġgamma <|end|> \n
    assert (row.reasoning_turns, row.reasoning_dropped) == (1, 1)


def test_bad_tokenizer_directories_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"--tokenizer {tmp_path}: no tokenizer_config.json"):
        load_tokenizer(str(tmp_path))
    model = build_model_dir(tmp_path, QWEN3_TEMPLATE)
    (model / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    with pytest.raises(ConfigError, match="has no chat_template"):
        load_tokenizer(str(model))


# SpecForge's span rule (specforge/data/parse.py, GeneralParser.parse), restated for the check
# below: SpecForge itself needs torch, which this project does not install. Markers are its
# registry's qwen3-thinking / qwen3-instruct values; token indexes come from re-tokenizing each
# span's prefix, cut at max_length.
SPECFORGE_QWEN3 = ("<|im_start|>assistant\n", "<|im_end|>\n")
SPECFORGE_QWEN3_INSTRUCT_IGNORE = ("<think>\n\n</think>\n\n",)


def specforge_loss_tokens(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    max_length: int,
    thinking: bool,
    last_turn_only: bool = False,
) -> int:
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=False, enable_thinking=thinking
    )
    ids = tokenizer(text, max_length=max_length, truncation=True, add_special_tokens=False)["input_ids"]
    mask = [0] * len(ids)

    def index(prefix: str) -> int:
        encoded = tokenizer.encode(prefix, add_special_tokens=False, truncation=True, max_length=max_length)
        return min(len(encoded), len(ids))

    header, eot = SPECFORGE_QWEN3
    pattern = re.escape(header) + r"([\s\S]*?(?:" + re.escape(eot) + "|$))"
    matches = list(re.finditer(pattern, text, re.DOTALL))
    if last_turn_only:
        matches = matches[-1:]
    for m in matches:
        for i in range(index(text[: m.start(1)]), index(text[: m.end(1)])):
            mask[i] = 1
    for ignore in () if thinking else SPECFORGE_QWEN3_INSTRUCT_IGNORE:
        start = 0
        while (at := text.find(ignore, start)) != -1:
            for i in range(index(text[:at]), index(text[: at + len(ignore)])):
                mask[i] = 0
            start = at + len(ignore)
    return sum(mask)


def sim_rows() -> list[list[dict[str, Any]]]:
    """Rows shaped like the simulator's: long filler thoughts, one to three turns."""
    rows = []
    for n in range(12):
        reasoning = " ".join(_REASONING_WORDS[(n + i) % len(_REASONING_WORDS)] for i in range(40 + 37 * n))
        answer = " ".join(_ANSWER_WORDS[(n + i) % len(_ANSWER_WORDS)] for i in range(5 + 11 * n))
        row = [msg("system", "be brief")] if n % 4 == 0 else []
        for turn in range(1 + n % 3):
            row += [msg("user", f"question {n} part {turn}"), msg("assistant", answer, reasoning[turn:])]
        rows.append(row)
    return rows


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("max_length", [64, 300, 100_000])
@pytest.mark.parametrize("last_turn_only", [False, True])
def test_counts_agree_with_specforges_rule(
    qwen3: Any, thinking: bool, max_length: int, last_turn_only: bool
) -> None:
    count = counter(qwen3, thinking, max_length=max_length, last_turn_only=last_turn_only)
    for row in sim_rows():
        if not thinking:
            row = [{**m, "reasoning_content": None} for m in row]
        ours = count.count(row).loss_tokens
        assert ours == specforge_loss_tokens(qwen3, row, max_length, thinking, last_turn_only), row


def test_preserve_thinking_renders_and_counts_the_earlier_reasoning(qwen3: Any) -> None:
    messages = [
        msg("user", "alpha"),
        msg("assistant", "beta", "gamma delta"),
        msg("user", "delta"),
        msg("assistant", "gamma", "alpha"),
    ]
    kept = LossTokenCounter(qwen3, TrainerView(), True, "test", preserve_thinking=True).count(messages)
    # turn 1 now: <think> \n gamma Ġdelta \n </think> \n\n beta <|im_end|> \n (10) instead of 3
    assert kept.loss_tokens == 10 + 9
    assert (kept.reasoning_turns, kept.reasoning_dropped) == (2, 0)
