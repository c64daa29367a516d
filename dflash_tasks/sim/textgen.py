"""Deterministic output plans and cheap filler text in the Qwen3 thinking format.

A request's output length is drawn from a lognormal distribution seeded by ``(seed, prompt)``, so
the same prompt always gets the same answer.  Text is filler words (one word per token, capped at
:data:`MAX_TEXT_WORDS` per section); tests should assert ``usage`` numbers, not text.

Tokens are counted as SGLang counts a Qwen3 model's: every generated token, the think markers in
Qwen3's tokens (``<think>`` and its newline, the newline and ``</think>`` closing the thought, the
blank line before the answer) and the ``<|im_end|>`` a finished answer stops on (generated and
counted, never in the text); the reasoning tokens are the thought's, ``</think>`` included.

With ``--loop-share`` a share of the samples falls into a loop as real models do: early in the
thought (or the answer, without thinking: 5-15% in, at most :data:`LOOP_START_MAX` tokens) one
sentence or one paragraph starts repeating, word for word, and never ends: the sample runs to
``max_tokens`` (``finish_reason: length``).
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass, replace

IM_END_TOKEN_ID = 151645
"""``<|im_end|>``: the ``matched_stop`` of a request that finished normally."""

#: Qwen3's tokens for ``<think>\n`` (the opener) and for ``\n</think>`` (the thought's end), and
#: the blank line after ``</think>`` that starts the answer.
THINK_OPEN_TOKENS = ("<think>", "\n")
THINK_CLOSE_TOKENS = ("\n", "</think>")
ANSWER_BREAK = "\n\n"
#: ``<|im_end|>``: the stop token, a completion token without text (SGLang drops it from the text).
STOP_TEXT = ""

#: The tokens other than words (a regex): the think markers, a blank line, a newline.
MARKER_PIECES = r"</?think>|\n\n|\n"
#: The pieces of a text as :func:`output_tokens` makes its tokens (:func:`prefix_tokens`).
_PREFIX_PIECE = re.compile(MARKER_PIECES + r"|[^\s<]+")

MAX_TEXT_WORDS = 4096
#: A short answer's tokens, its stop token included.
SHORT_ANSWER_TOKENS = (4, 8)
#: The fewest tokens of a thought (its markers and one word) and of the answer after it (the blank
#: line, one word and the stop token).
MIN_REASONING_TOKENS = len(THINK_OPEN_TOKENS) + 1 + len(THINK_CLOSE_TOKENS)
MIN_ANSWER_TOKENS = 3
#: Where a looping sample falls into its loop: this share of its planned thought (or answer), and
#: at most this many tokens in (early enough that a loop can be stopped within a quarter of 4,096).
LOOP_START_SHARE = (0.05, 0.15)
LOOP_START_MAX = 512
#: Words of a looping sentence, and sentences of a looping paragraph.
LOOP_SENTENCE_WORDS = (8, 16)
LOOP_PARAGRAPH_SENTENCES = (3, 5)

_REASONING_TEXT = """okay let me think about this carefully first the problem asks for which means
we need to check whether that holds so consider case wait actually hmm maybe another approach would
be simpler compute step then verify result again alternatively suppose value condition therefore"""
_ANSWER_TEXT = "the answer is therefore final result we get so this gives value solution thus equals"


def _vocab(text: str) -> list[str]:
    return text.split()


_REASONING_WORDS = _vocab(_REASONING_TEXT)
_ANSWER_WORDS = _vocab(_ANSWER_TEXT)
#: Every word the filler text is made of.
FILLER_WORDS = tuple(dict.fromkeys(_REASONING_WORDS + _ANSWER_WORDS))


@dataclass(frozen=True)
class LoopPlan:
    """A sample that loops: from output token ``at`` on, one span repeats until the end."""

    at: int
    #: 1: a sentence repeats; more: a paragraph of that many sentences.
    sentences: int


@dataclass(frozen=True)
class Plan:
    """How many tokens a request produces, and how it ends.

    ``reasoning_tokens`` counts the think block from ``<think>`` to ``</think>``, both included;
    ``answer_tokens`` the rest (the blank line after ``</think>``, the answer and, when it stops,
    its stop token); ``thinking`` says whether the model opened a thought at all; ``finish_reason``
    is ``stop``, ``length`` or ``abort``; ``loop``: where the output falls into a loop, if it does.
    """

    thinking: bool
    reasoning_tokens: int
    answer_tokens: int
    planned_reasoning: int
    finish_reason: str
    loop: LoopPlan | None = None

    @property
    def completion_tokens(self) -> int:
        """Tokens generated in total (reasoning + answer), as SGLang's ``completion_tokens``."""
        return self.reasoning_tokens + self.answer_tokens


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
    """The untruncated plan: ~``reasoning_fraction`` reasoning when thinking, else a short answer
    (the markers and the stop token counted in)."""
    if not thinking:
        answer = rng.randint(*SHORT_ANSWER_TOKENS)
        return Plan(False, 0, answer, 0, "stop")
    total = max(MIN_REASONING_TOKENS + MIN_ANSWER_TOKENS, draw_length(rng, mean, sigma))
    reasoning = min(total - MIN_ANSWER_TOKENS, max(MIN_REASONING_TOKENS, round(total * reasoning_fraction)))
    return Plan(True, reasoning, total - reasoning, reasoning, "stop")


def plan_loop(rng: random.Random, plan: Plan, share: float, endless: int) -> Plan:
    """With probability ``share``, ``plan`` falling into a loop that runs ``endless`` tokens (the
    context: until ``max_tokens`` cuts it) instead of ending; else ``plan`` itself."""
    if share <= 0 or rng.random() >= share:
        return plan
    body = plan.reasoning_tokens if plan.thinking else plan.answer_tokens
    at = min(LOOP_START_MAX, max(1, round(body * rng.uniform(*LOOP_START_SHARE))))
    at += len(THINK_OPEN_TOKENS) if plan.thinking else 0
    sentences = 1 if rng.random() < 0.5 else rng.randint(*LOOP_PARAGRAPH_SENTENCES)
    loop = LoopPlan(at, sentences)
    if plan.thinking:
        return Plan(True, endless, 0, endless, "stop", loop)
    return Plan(False, 0, endless, 0, "stop", loop)


def truncate(plan: Plan, limit: int, reason: str) -> Plan:
    """Cut the plan to at most ``limit`` tokens, ending with ``reason`` if anything was cut."""
    if plan.completion_tokens <= limit:
        return plan
    reasoning = min(plan.reasoning_tokens, limit)
    return replace(plan, reasoning_tokens=reasoning, answer_tokens=limit - reasoning, finish_reason=reason)


def continue_plan(full: Plan, done: int) -> Plan:
    """What is left of the untruncated plan ``full`` after a prefix of ``done`` of its tokens
    (``continue_final_message``): the rest of the thought, if any, and the answer."""
    if not full.thinking:
        return replace(full, answer_tokens=max(1, full.answer_tokens - done))
    if done < full.reasoning_tokens:
        left = full.reasoning_tokens - done
        return replace(full, reasoning_tokens=left, planned_reasoning=left)
    answer = max(1, full.answer_tokens - (done - full.reasoning_tokens))
    return replace(full, reasoning_tokens=0, planned_reasoning=0, answer_tokens=answer)


def prefix_tokens(prefix: str) -> int:
    """The completion tokens a continued prefix holds, counted as :func:`output_tokens` makes them
    (``<think>``, ``</think>``, a newline, a blank line and each word one token)."""
    return len(_PREFIX_PIECE.findall(prefix))


def _filler_tokens(rng: random.Random, tokens: int, vocab: list[str]) -> list[str]:
    """Filler words as tokens, each with the space (or full stop) before it as a BPE token has it;
    sentences of 12 words, the last one ending in a full stop."""
    words = rng.choices(vocab, k=min(max(tokens, 0), MAX_TEXT_WORDS))
    out = []
    for i, word in enumerate(words):
        text = word.capitalize() if i % 12 == 0 else word
        out.append(("" if i == 0 else ". " if i % 12 == 0 else " ") + text)
    if out:
        out[-1] += "."
    return out


def _loop_unit(rng: random.Random, sentences: int, vocab: list[str]) -> list[str]:
    """The span a looping sample repeats: a sentence (`` Word … word.``) or a paragraph
    (``\n\n``, a token of its own, and ``sentences`` sentences)."""
    unit: list[str] = [ANSWER_BREAK] if sentences > 1 else []
    for n in range(sentences):
        words = rng.choices(vocab, k=rng.randint(*LOOP_SENTENCE_WORDS))
        first = "" if sentences > 1 and n == 0 else " "
        unit += [first + words[0].capitalize(), *(" " + w for w in words[1:])]
        unit[-1] += "."
    return unit


def _looping_tokens(rng: random.Random, plan: Plan, loop: LoopPlan, end: int) -> list[str]:
    """The first ``end`` tokens of a looping plan: the natural start, then the span repeated
    (text past :data:`MAX_TEXT_WORDS` tokens is empty)."""
    vocab = _REASONING_WORDS if plan.thinking else _ANSWER_WORDS
    head = list(THINK_OPEN_TOKENS) if plan.thinking else []
    tokens = head + _filler_tokens(rng, loop.at - len(head), vocab)
    unit = _loop_unit(rng, loop.sentences, vocab)
    text_end = min(end, MAX_TEXT_WORDS)
    while len(tokens) < text_end:
        tokens += unit
    return _padded(tokens[:text_end], end)


def output_tokens(rng: random.Random, plan: Plan, end: int | None = None) -> list[str]:
    """The plan's raw output as tokens, Qwen3 hybrid style: ``<think>``, ``\n``, the thought,
    ``\n``, ``</think>``, ``\n\n``, the answer and the stop token (words past
    :data:`MAX_TEXT_WORDS` are empty); a looping plan's only up to ``end``, since it never ends. A
    plan cut short (:func:`truncate`) gives the first of its tokens."""
    if plan.loop is not None:
        return _looping_tokens(rng, plan, plan.loop, plan.completion_tokens if end is None else end)
    stop = [STOP_TEXT] if plan.finish_reason == "stop" else []
    head = [ANSWER_BREAK] if plan.thinking and plan.answer_tokens > 0 else []
    words = max(0, plan.answer_tokens - len(head) - len(stop))
    answer = [*head, *_padded(_filler_tokens(rng, words, _ANSWER_WORDS), words), *stop]
    if not plan.thinking:
        return answer[: plan.answer_tokens]
    words = max(0, plan.planned_reasoning - len(THINK_OPEN_TOKENS) - len(THINK_CLOSE_TOKENS))
    thought = _padded(_filler_tokens(rng, words, _REASONING_WORDS), words)
    think = [*THINK_OPEN_TOKENS, *thought, *THINK_CLOSE_TOKENS][: plan.reasoning_tokens]
    return think + answer[: plan.answer_tokens]


def _padded(tokens: list[str], count: int) -> list[str]:
    return tokens + [""] * (count - len(tokens))


def span_tokens(rng: random.Random, full: Plan, start: int, end: int) -> list[str]:
    """Tokens ``start..end`` of the untruncated plan's output: what a request that was cut, or that
    continued a prefix of ``start`` tokens, generated."""
    return output_tokens(rng, full, end)[start:end]


def render_span(rng: random.Random, full: Plan, start: int, end: int) -> str:
    """:func:`span_tokens` as one text."""
    return "".join(span_tokens(rng, full, start, end))


def render_raw(rng: random.Random, plan: Plan) -> str:
    """The raw text of a plan (:func:`output_tokens` joined)."""
    return "".join(output_tokens(rng, plan))


def split_reasoning(raw: str, force_reasoning: bool, previous: str = "") -> tuple[str | None, str]:
    """The SGLang 0.5.23 ``qwen3`` parser (no stripping): ``(reasoning_content, content)``;
    ``previous``: a continued prefix (``continue_final_message``), which it reads first (a
    ``<think>`` in it starts the thought, a ``</think>`` ends it)."""
    if "</think>" in previous:
        return None, raw
    started = raw.startswith("<think>")
    if not (started or force_reasoning or "<think>" in previous):
        return None, raw
    body = raw[len("<think>") :] if started else raw
    reasoning, closed, content = body.partition("</think>")
    if not closed:
        return reasoning or None, ""
    return reasoning or None, content
