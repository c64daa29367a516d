"""A tiny model directory whose tokenizer fits the simulator's words, built on the spot (no downloads).

A simulator started with ``--model-path`` pointing at one reports it in ``/model_info``, and the
worker beside it counts each record's loss tokens with it, as beside a real server: so the demo
and the tests measure the trainable yield without a real model. A byte-level BPE trained with
``tokenizers`` on the simulator's own output (:mod:`dflash_tasks.sim.textgen`), its words and a
few more: each word the simulator writes (with the space before it, capitalised or not, with a
full stop after it or not) one token, ``<think>`` and ``</think>`` one token each and ``\n\n``
one token, as in Qwen3's tokenizer; so the simulator's text tokenizes to exactly the
``completion_tokens`` it reports, less the stop token (``<|im_end|>``, which the text leaves out)
and the tokens past :data:`~dflash_tasks.sim.textgen.MAX_TEXT_WORDS` words a section (empty text).
Saved as ``tokenizer.json`` plus a ``tokenizer_config.json`` carrying a chat template:
:data:`QWEN3_TEMPLATE` follows Qwen3's rules (think blocks only for assistant turns after the last
user message unless ``preserve_thinking``, as Qwen3.6's, the empty think block with
``enable_thinking`` false); :data:`PLAIN_TEMPLATE` is a header-and-end template without reasoning.
Other text (prompts) falls apart into short pieces, as rare words do.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from dflash_tasks.sim.textgen import ANSWER_BREAK, FILLER_WORDS, plan_output, render_raw

#: Qwen3's rules: the last-query rule, reasoning_content rendered in a think block, and the empty
#: think block of the generation prompt with thinking off.
QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- set reasoning = m.reasoning_content or '' -%}"
    "{%- if (loop.index0 > ns.last_query and (loop.last or reasoning))"
    " or (preserve_thinking is defined and preserve_thinking and reasoning) -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n'"
    " + m.content.lstrip('\\n') -}}"
    "{%- else -%}{{- '<|im_start|>assistant\\n' + m.content -}}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)

#: No reasoning at all: ``### role:`` headers, each message closed by ``<|end|>``.
PLAIN_TEMPLATE = (
    "{%- for m in messages -%}{{- '### ' + m.role + ':\\n' + m.content + '<|end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '### assistant:\\n' -}}{%- endif -%}"
)

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|end|>", "<|endoftext|>"]
ADDED = ["<think>", "</think>"]
#: Words the tokenizer knows as single tokens (with and without a leading space).
WORDS = ("alpha", "beta", "gamma", "delta")
#: One piece per word the simulator writes: the space, or full stop and space, before it, and a
#: full stop after it.
WORD_PIECE = r"(?:\. | )?[A-Za-z]+\.?"
#: Enough for every word the simulator writes to be one token (BPE stops at fewer).
VOCAB_SIZE = 3000


def build_model_dir(where: Path, template: str, name: str = "tiny-qwen3") -> Path:
    """A model directory ``where/name`` with the tokenizer and ``template``; returns its path."""
    path = where / name
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    # a word with the space, or full stop and space, before it (and a full stop after it) is one
    # piece, as the simulator emits its tokens; bytes for whatever else a row holds
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(WORD_PIECE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    rng = random.Random(0)
    said = [render_raw(rng, plan_output(rng, True, 400, 0.5, 0.8)) for _ in range(60)]
    lines = [" ".join(WORDS), " " + " ".join(WORDS)] * 50 + list(WORDS) * 20 + said
    lines += [form for word in FILLER_WORDS for form in _word_forms(word)] * 20 + [ANSWER_BREAK] * 100
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.add_tokens(ADDED)
    return save_model_dir(path, tokenizer, template)


def _word_forms(word: str) -> list[str]:
    """``word`` in each form the simulator writes it: opening a text, after a space (capitalised
    after a full stop), ending a sentence."""
    title = word.capitalize()
    return [f"{title} {word} {word}. {title} {title}.", f"{title}."]


def save_model_dir(path: Path, tokenizer: Tokenizer, template: str, **config: object) -> Path:
    """Write ``tokenizer`` and a ``tokenizer_config.json`` carrying ``template`` (and ``config``)
    into the model directory ``path``; returns it."""
    tokenizer.save(str(path / "tokenizer.json"))
    doc = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        **config,
        "model_max_length": 1_000_000,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(doc, indent=2))
    return path
