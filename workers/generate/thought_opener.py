"""What a continuation's prefix starts with, read once from the served model's chat template.

The prefix must be what the model saw after its generation prompt: Qwen3's template ends the
prompt at ``<|im_start|>assistant\\n`` and the model writes ``<think>\\n`` itself, Qwen3.5/3.6's
prompt already ends in ``<think>\\n``. The worker reads the template from the model directory the
server reports (``/model_info``'s ``model_path``, on the same disk); when it cannot be read (a
hub id, a simulator) the prefix starts with Qwen3's ``<think>\\n``.
"""

from __future__ import annotations

import functools
import logging

from dflash_tasks.core.continuation import THOUGHT_OPENER, opener_for
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.loss_tokens import load_tokenizer, markers_of

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def thought_opener(model_path: str | None) -> str:
    """The opener for the model at ``model_path`` (see the module docstring)."""
    if not model_path:
        return THOUGHT_OPENER
    try:
        header = markers_of(load_tokenizer(model_path), True, model_path).assistant_header
    except ConfigError as exc:
        log.info("continuations open the thought with %r: %s", THOUGHT_OPENER, exc)
        return THOUGHT_OPENER
    return opener_for(header)
