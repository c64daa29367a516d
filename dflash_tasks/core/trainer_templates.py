"""The chat templates SpecForge registers for the Qwen3 family, as its trainer marks loss spans.

SpecForge's trainer (``specforge/data/parse.py``, 0.2.0) renders a row with the tokenizer's own
chat template, then finds each loss span by its *registered* template's markers: from the
assistant header (excluded) through the end-of-turn marker (included), minus the ignore strings.
When the first message is not a system message and the registered template has a system prompt,
that prompt is rendered first. With ``enable_thinking`` it renders with ``enable_thinking=True``.

The values below are SpecForge's (``specforge/data/template.py``); ``--train-template NAME`` picks
one, and the loss-token count then marks spans exactly as that trainer does. Without it the
markers come from the tokenizer's template (:func:`dflash_tasks.core.loss_tokens.markers_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_tasks.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class RegisteredTemplate:
    """One of SpecForge's registered chat templates (the fields its parser reads)."""

    name: str
    assistant_header: str
    end_of_turn: str
    system_prompt: str = ""
    ignore: tuple[str, ...] = ()
    enable_thinking: bool = False  # the parser renders with enable_thinking=True


_IM_START, _IM_END = "<|im_start|>assistant\n", "<|im_end|>\n"

REGISTERED: dict[str, RegisteredTemplate] = {
    t.name: t
    for t in (
        # Qwen3.5 / Qwen3.6 (SpecForge's Qwen3.6-27B DFlash recipe): earlier turns, rendered
        # without the think header, carry no loss.
        RegisteredTemplate("qwen3.5", _IM_START + "<think>\n", _IM_END, enable_thinking=True),
        RegisteredTemplate(
            "qwen3-next-thinking",
            _IM_START + "<think>\n",
            _IM_END,
            "You are a helpful assistant.",
            enable_thinking=True,
        ),
        RegisteredTemplate(
            "qwen3-thinking", _IM_START, _IM_END, "You are a helpful assistant.", enable_thinking=True
        ),
        RegisteredTemplate(
            "qwen3-instruct", _IM_START, _IM_END, "You are a helpful assistant.", ("<think>\n\n</think>\n\n",)
        ),
    )
}


def registered(name: str) -> RegisteredTemplate:
    """The registered template ``name``; :class:`ConfigError` naming the known ones."""
    try:
        return REGISTERED[name]
    except KeyError:
        raise ConfigError(
            f"--train-template {name!r}: not a template this project knows (one of {', '.join(REGISTERED)})"
        ) from None
