"""Exception messages made fit to log: quoted (possibly sample) text masked."""

from __future__ import annotations

import pytest

from dflash_tasks.core.log_text import MAX_CHARS, exception_text, masked


@pytest.mark.parametrize(
    ("message", "logged"),
    [
        ("no quotes here", "no quotes here"),
        ("can't read 'the answer'", "can't read <10 chars>"),
        ("got b'raw bytes' and b\"more\"", "got <9 chars> and <4 chars>"),
        ("cannot render 'the answer is 42'", "cannot render <16 chars>"),
        ('bad token "x" in "yy"', "bad token <1 chars> in <2 chars>"),
        (r"""text 'it\'s "so"' left""", "text <10 chars> left"),
        (
            "reasoning: expected a string, got 'a thought cut at forty charact...",
            "reasoning: expected a string, got <33 chars>",
        ),
        ("a line\n'two\nlines'", "a line\n<9 chars>"),
        ("ends in 'a backslash\\", "ends in <12 chars>"),
    ],
)
def test_quoted_text_is_masked_by_its_length(message: str, logged: str) -> None:
    assert masked(message) == logged


def test_a_long_message_is_cut_and_an_exception_names_its_type() -> None:
    assert masked("x" * 1000) == "x" * MAX_CHARS + "..."
    assert exception_text(KeyError("secret prompt")) == "KeyError: <13 chars>"
    assert exception_text(ValueError()) == "ValueError"
