"""Exception messages made fit to log: the quoted text in them, which may be a sample's (an
exception repeating the value it choked on), is replaced by its length."""

from __future__ import annotations

import re

#: The longest message logged; the rest is cut.
MAX_CHARS = 300

# A quoted string (a bytes repr's too), escapes included; one whose closing quote was cut off runs
# to the end. A quote after a letter is an apostrophe ("can't"), not an opening one.
_QUOTED = re.compile(
    r"""(?<!\w)b?'((?:[^'\\]|\\.?)*)(?:'|$)|(?<!\w)b?"((?:[^"\\]|\\.?)*)(?:"|$)""", re.DOTALL
)


def masked(message: str) -> str:
    """``message`` with each quoted string replaced by ``<N chars>`` and cut to :data:`MAX_CHARS`."""
    text = _QUOTED.sub(lambda quoted: f"<{len(quoted.group(1) or quoted.group(2) or '')} chars>", message)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "..."


def exception_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, its message :func:`masked`."""
    message = masked(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
