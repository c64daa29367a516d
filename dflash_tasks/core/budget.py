"""How many tokens a request may generate: a fixed ``--max-tokens N``, or the trainer's horizon.

``--max-tokens horizon`` (``DFLASH_MAX_TOKENS=horizon``) ties each request's budget to the trainer:
the trainer renders a row, cuts it at ``max_length`` and learns nothing past the cut, so a request
whose row's prefix (the conversation up to the answer being generated, rendered as the export
writes the row) takes ``P`` tokens may usefully generate ``max_length - P`` tokens.
:func:`horizon_budget` adds the template's closing tokens (what it writes after an answer,
``<|im_end|>\\n`` for Qwen: 2) as a margin, so that the trainer's cut falls inside the generated text
even where the template renders a cut thought a token or two shorter than it was generated
(stripped newlines, a merge at the cut), and the horizon rule of the export writes the row. At most
that margin is paid past the horizon per request. A prefix at or past ``max_length`` still gets
:data:`HORIZON_FLOOR` tokens: every sample gets an answer, none of which the trainer sees.

The worker computes it per request with the served model's tokenizer
(:mod:`workers.generate.request_budget`); where it cannot read one, every request gets the job's
``max_tokens``, which a horizon job records as the trainer's ``max_length``.
"""

from __future__ import annotations

from dflash_tasks.core.errors import ConfigError

#: The budget when none is given (``enqueue --max-tokens``, ``DFLASH_MAX_TOKENS``).
DEFAULT_MAX_TOKENS = 4096
#: ``--max-tokens horizon``: each request's budget is the trainer's horizon (:func:`horizon_budget`).
HORIZON = "horizon"
#: The job spec's ``budget_policy``: one fixed ``max_tokens`` for every request, or the horizon.
FIXED = "fixed"
BUDGET_POLICIES = (FIXED, HORIZON)
#: The least a request gets under the horizon policy (its prefix already fills ``max_length``).
HORIZON_FLOOR = 16


def parse_max_tokens(text: str | int) -> int | str:
    """A ``--max-tokens`` value: a number of tokens (>= 1) or :data:`HORIZON`; :class:`ConfigError`
    otherwise (the flag and ``DFLASH_MAX_TOKENS`` accept the same values)."""
    value: int | None = None
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str) and text.strip().lower() == HORIZON:
        return HORIZON
    elif isinstance(text, str):
        try:
            value = int(text.strip())
        except ValueError:
            value = None
    if value is None or value < 1:
        raise ConfigError(f"expected a number of tokens (>= 1) or {HORIZON!r}, got {text!r}")
    return value


def horizon_budget(
    max_length: int, prefix_tokens: int, closing_tokens: int, floor: int = HORIZON_FLOOR
) -> int:
    """The budget of a request whose row's prefix takes ``prefix_tokens`` under a trainer cutting
    at ``max_length``: ``max_length - prefix_tokens + closing_tokens``, never below ``floor``."""
    return max(floor, max_length - prefix_tokens + closing_tokens)
