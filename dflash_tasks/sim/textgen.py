"""Deterministic output plans and cheap filler text in the Qwen3 thinking format.

A request's output length is drawn from a lognormal distribution seeded by ``(seed, prompt)``, so
the same prompt always gets the same answer.  Text is filler words (about one word per token,
capped at :data:`MAX_TEXT_WORDS` per section); tests should assert ``usage`` numbers, not text.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, replace

IM_END_TOKEN_ID = 151645
"""``<|im_end|>``: the ``matched_stop`` of a request that finished normally."""

MAX_TEXT_WORDS = 4096
SHORT_ANSWER_TOKENS = (4, 8)

_REASONING_TEXT = """okay let me think about this carefully first the problem asks for which means
we need to check whether that holds so consider case wait actually hmm maybe another approach would
be simpler compute step then verify result again alternatively suppose value condition therefore"""
_ANSWER_TEXT = "the answer is therefore final result we get so this gives value solution thus equals"


def _vocab(text: str) -> list[str]:
    return text.split()


_REASONING_WORDS = _vocab(_REASONING_TEXT)
_ANSWER_WORDS = _vocab(_ANSWER_TEXT)


@dataclass(frozen=True)
class Plan:
    """How many tokens a request produces, and how it ends.

    ``reasoning_tokens`` counts the think block including ``</think>``; ``thinking`` says whether
    the model opened one at all; ``finish_reason`` is ``stop``, ``length`` or ``abort``.
    """

    thinking: bool
    reasoning_tokens: int
    answer_tokens: int
    planned_reasoning: int
    finish_reason: str

    @property
    def completion_tokens(self) -> int:
        """Tokens generated in total (reasoning + answer)."""
        return self.reasoning_tokens + self.answer_tokens

    @property
    def reasoning_closed(self) -> bool:
        """True when ``</think>`` was generated (reasoning not cut short)."""
        return self.thinking and self.reasoning_tokens >= self.planned_reasoning


def prompt_rng(seed: int, prompt: str) -> random.Random:
    """A RNG keyed by the simulator seed and the prompt text."""
    digest = hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def draw_length(rng: random.Random, mean: int, sigma: float) -> int:
    """A lognormal length with the given mean (``sigma`` is the log-space spread; 0 = fixed)."""
    if sigma == 0:
        return mean
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, round(rng.lognormvariate(mu, sigma)))


def draw_accept_length(rng: random.Random, mean: float, sd: float, cap: int) -> float:
    """A request's accept length in ``[1, cap]``: ``1 + (cap - 1) * Beta`` with the given mean and
    standard deviation (``sd`` 0, or a mean at either end, gives exactly ``mean``)."""
    rate = (mean - 1.0) / (cap - 1)
    if sd <= 0 or not 0.0 < rate < 1.0:
        return mean
    variance = min((sd / (cap - 1)) ** 2, 0.9 * rate * (1.0 - rate))
    k = rate * (1.0 - rate) / variance - 1.0
    return 1.0 + (cap - 1) * rng.betavariate(rate * k, (1.0 - rate) * k)


def plan_output(
    rng: random.Random, thinking: bool, mean: int, sigma: float, reasoning_fraction: float
) -> Plan:
    """The untruncated plan: ~``reasoning_fraction`` reasoning when thinking, else a short answer."""
    if not thinking:
        answer = rng.randint(*SHORT_ANSWER_TOKENS)
        return Plan(False, 0, answer, 0, "stop")
    total = draw_length(rng, mean, sigma)
    reasoning = max(1, min(total - 1, round(total * reasoning_fraction))) if total > 1 else 1
    return Plan(True, reasoning, total - reasoning, reasoning, "stop")


def truncate(plan: Plan, limit: int, reason: str) -> Plan:
    """Cut the plan to at most ``limit`` tokens, ending with ``reason`` if anything was cut."""
    if plan.completion_tokens <= limit:
        return plan
    reasoning = min(plan.reasoning_tokens, limit)
    return replace(plan, reasoning_tokens=reasoning, answer_tokens=limit - reasoning, finish_reason=reason)


def _filler(rng: random.Random, tokens: int, vocab: list[str]) -> str:
    words = rng.choices(vocab, k=min(max(tokens, 0), MAX_TEXT_WORDS))
    sentences = (" ".join(words[i : i + 12]) for i in range(0, len(words), 12))
    return ". ".join(s.capitalize() for s in sentences) + ("." if words else "")


def render_raw(rng: random.Random, plan: Plan) -> str:
    """The raw generated text, Qwen3 hybrid style: ``<think>\\n…\\n</think>\\n\\nanswer``."""
    answer = _filler(rng, plan.answer_tokens, _ANSWER_WORDS)
    if not plan.thinking or plan.completion_tokens == 0:
        return answer
    reasoning = "<think>\n" + _filler(rng, plan.reasoning_tokens - 1, _REASONING_WORDS)
    if not plan.reasoning_closed:
        return reasoning
    return reasoning + "\n</think>\n\n" + answer


def split_reasoning(raw: str, force_reasoning: bool) -> tuple[str | None, str]:
    """The SGLang 0.5.23 ``qwen3`` parser (no stripping): ``(reasoning_content, content)``."""
    started = raw.startswith("<think>")
    if not (started or force_reasoning):
        return None, raw
    body = raw[len("<think>") :] if started else raw
    reasoning, closed, content = body.partition("</think>")
    if not closed:
        return reasoning or None, ""
    return reasoning or None, content
