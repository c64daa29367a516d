"""A tiny Qwen3 checkpoint whose every answer is a fixed chain of tokens, built here, never downloaded.

Run with the SGLang environment's interpreter (it needs torch, transformers and tokenizers):
``python -m tests.real_sglang.checkpoint DIR`` writes the checkpoint into ``DIR``. The tests call
:func:`tests.real_sglang.env.ensure_checkpoint`, which keys the cache directory by a hash of this
file (the recipe) and builds it atomically.

The model: one Qwen3 layer, ``HIDDEN`` units, a byte-level BPE tokenizer trained on a few lines
with ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>`` as special tokens and ``<think>`` and
``</think>`` as plain added tokens (as in Qwen3, so they survive detokenization), and a Qwen3-style
chat template with ``enable_thinking``. The weights are set by hand so that the next token
depends on the current one only:

* the embedding of token ``i`` is the unit vector ``e_i`` (orthonormal: ``HIDDEN`` >= vocabulary);
* every ``o_proj`` and ``down_proj`` is zero, so the residual stream stays ``e_i`` through the layer;
* ``lm_head`` row ``succ(i)`` is ``MARGIN * e_i``: after the final RMSNorm the successor's logit
  leads every other one by ``MARGIN * sqrt(HIDDEN)``, so any temperature samples the successor.

The successor chain, from the generation prompt's last token:

* thinking on (the prompt ends ``assistant\\n``, last token ``Ċ``):
  ``<think>`` THOUGHT ``</think>`` ``ĊĊ`` ANSWER ``<|im_end|>``;
* thinking off (the template already wrote ``<think>\\n\\n</think>\\n\\n``, last token ``ĊĊ``):
  ANSWER ``<|im_end|>``;
* any other token: ``<|im_end|>``.

The looping variant (``--loop``, :func:`ensure_checkpoint` with ``looping=True``) returns from the
thought's last word to its first, so a thinking answer is THOUGHT repeated until ``max_tokens``:
a model stuck in a loop, for the tests of loop detection and of the server's abort.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HIDDEN = 512
INTERMEDIATE = 128
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
MAX_POSITIONS = 8192
MARGIN = 6.0
REPO = Path(__file__).resolve().parents[2]

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
#: The thought and the answer every request gets, word for word (each word is one token).
THOUGHT_WORDS = (
    *("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett"),
    *("kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"),
    *("uniform", "victor", "whiskey", "xray", "yankee", "zulu"),
)
ANSWER_WORDS = ("the", "answer", "is", "forty", "two")
THOUGHT = " ".join(THOUGHT_WORDS)
ANSWER = " ".join(ANSWER_WORDS)
#: Tokens of one thinking answer: <think>, the thought, </think>, ĊĊ, the answer, <|im_end|>.
THINKING_COMPLETION_TOKENS = 1 + len(THOUGHT_WORDS) + 1 + 1 + len(ANSWER_WORDS) + 1
#: Tokens of one answer without thinking: the answer, <|im_end|>.
PLAIN_COMPLETION_TOKENS = len(ANSWER_WORDS) + 1

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}"
    "{%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def _training_lines() -> list[str]:
    """Text the BPE learns from: each chain word repeated so that it merges into one token, and
    the newlines of the template (so ``\\n\\n`` becomes one token)."""
    words = [*THOUGHT_WORDS, *ANSWER_WORDS, "system", "user", "assistant", "question", "what"]
    line = " ".join(words)
    # A text ending in "\n\n" keeps them together (mid-text, GPT-2's split parts them).
    return [f" {line}\n\n" for _ in range(50)]


def build_tokenizer() -> Any:
    """The trained tokenizer (a ``tokenizers.Tokenizer``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        min_frequency=2,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_lines(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_OPEN, THINK_CLOSE)])
    return tok


def _one_token(tok: Any, text: str) -> int:
    ids = tok.encode(text, add_special_tokens=False).ids
    if len(ids) != 1:
        raise RuntimeError(f"the tiny tokenizer splits {text!r} into {len(ids)} tokens; the recipe needs one")
    return int(ids[0])


def successors(tok: Any, looping: bool = False) -> dict[int, int]:
    """The chain: token id -> the id the model always answers next (others: ``<|im_end|>``);
    ``looping``: the thought's last word leads back to its first, for ever."""
    think_open, think_close = _one_token(tok, THINK_OPEN), _one_token(tok, THINK_CLOSE)
    newline, blank = _one_token(tok, "\n"), _one_token(tok, "\n\n")
    thought = [_one_token(tok, " " + w) for w in THOUGHT_WORDS]
    answer = [_one_token(tok, " " + w) for w in ANSWER_WORDS]
    im_end = _one_token(tok, "<|im_end|>")
    chain = [newline, think_open, *thought, think_close, blank, *answer, im_end]
    if len(set(chain)) != len(chain):
        raise RuntimeError("the chain repeats a token: it would loop")
    succ = dict(itertools.pairwise(chain))
    if looping:
        succ[thought[-1]] = thought[0]
    return succ


def build(target: Path, looping: bool = False) -> None:
    """Write the checkpoint (config, weights, tokenizer, template) into ``target``."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer()
    vocab = tok.get_vocab_size()
    if vocab > HIDDEN:
        raise RuntimeError(f"vocabulary {vocab} > hidden size {HIDDEN}: the embeddings cannot be orthonormal")
    im_end, endoftext = _one_token(tok, "<|im_end|>"), _one_token(tok, "<|endoftext|>")
    config = Qwen3Config(  # type: ignore[call-arg]
        vocab_size=HIDDEN,  # padded to the hidden size: every row keeps its own unit vector
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(HIDDEN))
        for norm in (model.model.norm, *(m for layer in model.model.layers for m in _norms(layer))):
            norm.weight.fill_(1.0)
        succ = successors(tok, looping)
        head = model.lm_head.weight
        for token in range(HIDDEN):
            head[succ.get(token, im_end), token] = MARGIN
    target.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(target, safe_serialization=True)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_POSITIONS,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(target)
    gen = {"bos_token_id": endoftext, "eos_token_id": [im_end, endoftext], "pad_token_id": endoftext}
    (target / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def _norms(layer: Any) -> tuple[Any, ...]:
    attn = layer.self_attn
    return (layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm)


class CheckpointUnavailable(RuntimeError):
    """The tiny checkpoint is not cached and could not be built."""


def checkpoint_dir(cache: Path, python: Path, looping: bool = False) -> Path:
    """Where the checkpoint of this recipe, built by ``python``'s environment, is cached."""
    recipe = Path(__file__).read_bytes() + str(python.parent.parent.name).encode()
    name = "tiny-qwen3-loop" if looping else "tiny-qwen3"
    return cache / f"{name}-{hashlib.sha256(recipe).hexdigest()[:12]}"


def ensure_checkpoint(cache: Path, python: Path, looping: bool = False) -> Path:
    """The cached checkpoint's directory, building it first (atomically) when it is missing."""
    target = checkpoint_dir(cache, python, looping)
    if (target / "config.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f".build-{target.name}-"))
    try:
        cmd = [str(python), "-m", "tests.real_sglang.checkpoint", str(tmp), *(["--loop"] if looping else [])]
        res = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ""}
        )
        if res.returncode:
            raise CheckpointUnavailable(f"building the tiny checkpoint failed: {res.stderr[-3000:]}")
        try:
            os.rename(tmp, target)
        except OSError:  # another run renamed its build into place first: use that one
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--loop"]):
        sys.exit("usage: python -m tests.real_sglang.checkpoint DIR [--loop]")
    build(Path(sys.argv[1]), looping=sys.argv[2:] == ["--loop"])
