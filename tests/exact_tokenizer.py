"""A model directory whose tokenizer counts the simulator's output exactly as the simulator does.

:mod:`dflash_tasks.sim.tokenizer` counts the simulator's text exactly too, but other text (a
prompt) in many short pieces; the budget tests check rows to the token, so they use this one: a
word-level model over :data:`SIM_PIECES`, one token per simulator token (``<think>``,
``</think>``, ``\\n``, ``\\n\\n``, each word with the space or ``. `` before it, the last one with
its full stop), every other stretch of text one token of its own. The simulator's text then counts
exactly the completion tokens it reported, less the stop token the text leaves out (a row has the
template's ``<|im_end|>`` in its place).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from dflash_tasks.sim.textgen import MARKER_PIECES
from dflash_tasks.sim.tokenizer import QWEN3_TEMPLATE, SPECIAL, WORD_PIECE, save_model_dir

SIM_PIECES = MARKER_PIECES + "|" + WORD_PIECE


def build_exact_model_dir(where: Path, template: str = QWEN3_TEMPLATE, name: str = "exact-qwen3") -> Path:
    """The model directory ``where/name`` (the tokenizer and ``template``); returns its path."""
    path = where / name
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(SIM_PIECES), behavior="isolated")
    tokenizer.add_special_tokens(SPECIAL)
    return save_model_dir(path, tokenizer, template, unk_token="[UNK]")
