"""The repetition detector (core/repetition.py): loops are seen early, with where they begin, and
the corpus of long natural reasoning with legitimate repetition never fires."""

from __future__ import annotations

import pytest

from dflash_tasks.core.quality import QualitySettings
from dflash_tasks.core.repetition import (
    CHECK_CHARS,
    Loop,
    RepetitionDetector,
    RepetitionSettings,
    first_loop,
)
from tests.repetition_support import (
    BUDGET,
    LONG_PARAGRAPH,
    PARAGRAPH,
    PHRASE,
    SENTENCE,
    corpus,
    looping,
    stream,
    tokens,
)

CORPUS = corpus()
#: A natural start before the loop: the first part of a fixture, cut at a paragraph.
PREFIX = CORPUS["enumeration"][: CORPUS["enumeration"].index("\n\n", 1500) + 2]
LOOPS = {"sentence": SENTENCE, "paragraph": PARAGRAPH, "phrase": PHRASE, "long_paragraph": LONG_PARAGRAPH}


def test_the_corpus_is_long_reasoning() -> None:
    assert len(CORPUS) >= 7
    assert sum(len(tokens(text)) for text in CORPUS.values()) > 15_000
    assert max(len(tokens(text)) for text in CORPUS.values()) > BUDGET  # one longer than the budget


@pytest.mark.parametrize("name", sorted(CORPUS))
@pytest.mark.parametrize("per_chunk", [1, 4])
def test_natural_reasoning_never_fires(name: str, per_chunk: int) -> None:
    loop, detector = stream(CORPUS[name], per_chunk=per_chunk)
    assert loop is None, (name, loop, CORPUS[name][loop.start_char : loop.start_char + 200] if loop else "")
    assert detector.chars == len(CORPUS[name])


def test_the_corpus_holds_repetition_a_laxer_rule_would_flag() -> None:
    """The corpus is no easy pass: at half the default run length, its legitimate repetition (a
    16 by 16 grid of zeros written out in code) reads as a loop."""
    lax = RepetitionSettings(min_chars=RepetitionSettings().min_chars // 2)
    flagged = {name for name, text in CORPUS.items() if stream(text, lax)[0] is not None}
    assert flagged == {"life_simulation"}


def test_the_whole_corpus_in_one_stream_never_fires() -> None:
    text = "\n\n".join(CORPUS.values())
    assert stream(text)[0] is None


@pytest.mark.parametrize("kind", sorted(LOOPS))
@pytest.mark.parametrize("per_chunk", [1, 4])
def test_a_loop_is_seen_early_with_where_it_begins(kind: str, per_chunk: int) -> None:
    unit = LOOPS[kind]
    loop, _ = stream(looping(PREFIX, unit), per_chunk=per_chunk)
    assert loop is not None
    prefix_tokens = len(tokens(PREFIX))
    spent = loop.detected_token - prefix_tokens  # tokens generated inside the loop
    assert spent <= 0.15 * BUDGET, (kind, spent)  # a quarter of the budget is the ceiling
    assert loop.period_chars == len(unit)
    assert abs(loop.start_char - len(PREFIX)) < len(unit)
    assert abs(loop.start_token - prefix_tokens) <= CHECK_CHARS // 2
    assert loop.copies >= RepetitionSettings().min_repeats


def test_the_loop_start_is_a_copy_of_the_span() -> None:
    text = looping(PREFIX, SENTENCE)
    loop, _ = stream(text)
    assert loop is not None
    start, period = loop.start_char, loop.period_chars
    assert text[start : start + period] == text[start + period : start + 2 * period]
    assert text[:start] == PREFIX[:start]  # the prefix before the loop is the natural text


def test_a_loop_from_the_first_token() -> None:
    loop, _ = stream(SENTENCE * 100)
    assert loop is not None and loop.start_char == 0 and loop.start_token == 0


def test_a_span_longer_than_max_period_is_not_seen() -> None:
    settings = RepetitionSettings(max_period=len(LONG_PARAGRAPH) - 1)
    assert stream(looping(PREFIX, LONG_PARAGRAPH), settings)[0] is None
    assert stream(looping(PREFIX, LONG_PARAGRAPH), RepetitionSettings())[0] is not None


def test_off_never_fires() -> None:
    assert stream(looping(PREFIX, SENTENCE), RepetitionSettings(enabled=False))[0] is None


def test_thresholds_move_the_detection() -> None:
    text = looping(PREFIX, SENTENCE)
    early, _ = stream(text, RepetitionSettings(min_chars=400))
    late, _ = stream(text, RepetitionSettings(min_chars=3200))
    assert early is not None and late is not None
    assert early.detected_token < late.detected_token
    assert early.start_char == late.start_char


def test_memory_is_bounded() -> None:
    detector = RepetitionDetector()
    text = "\n\n".join(CORPUS.values())  # no loop: its period is longer than max_period
    most = 0
    for _ in range(40):  # about 2.4 million characters
        for at in range(0, len(text), 40):
            assert detector.feed(text[at : at + 40], 10) is None
            most = max(most, detector.buffered_chars)
    settings = detector.settings
    assert most <= settings.window + 3 * CHECK_CHARS


def test_first_loop_scans_a_whole_text() -> None:
    loop = first_loop(looping(PREFIX, PARAGRAPH))
    assert loop is not None and abs(loop.start_char - len(PREFIX)) < len(PARAGRAPH)
    assert first_loop(CORPUS["grid_paths"]) is None


# --- settings ---------------------------------------------------------------------------------------


def test_a_loop_shifts_into_a_longer_or_shorter_text() -> None:
    loop = Loop(
        start_char=100, start_token=25, period_chars=10, copies=3.0, detected_char=160, detected_token=40
    )
    later = loop.shifted(50, 12)
    assert (later.start_char, later.detected_char, later.start_token, later.detected_token) == (
        150,
        210,
        37,
        52,
    )
    assert (later.period_chars, later.copies, later.text) == (10, 3.0, "reasoning")
    earlier = loop.shifted(-120, -30)  # never below 0
    assert (earlier.start_char, earlier.detected_char, earlier.start_token, earlier.detected_token) == (
        0,
        40,
        0,
        10,
    )
    assert loop.shifted(0) == loop


def test_settings_parse() -> None:
    assert RepetitionSettings.parse("") == RepetitionSettings()
    assert RepetitionSettings.parse("off") == RepetitionSettings(enabled=False)
    assert RepetitionSettings.parse(" min_chars=2000 , max_period=6000,on") == RepetitionSettings(
        min_chars=2000, max_period=6000
    )
    for bad in ("often", "min_chars=many", "min_repeats=1", "period=4"):
        with pytest.raises(ValueError, match=r"repetition|min_repeats"):
            RepetitionSettings.parse(bad)


def test_quality_settings_carry_the_rule() -> None:
    custom = QualitySettings(repetition=RepetitionSettings(min_chars=900, max_period=5000))
    assert QualitySettings.from_dict(custom.to_dict()) == custom
    assert custom.to_dict()["repetition"] == {
        "enabled": True,
        "min_chars": 900,
        "min_repeats": 2,
        "max_period": 5000,
    }
    old = {k: v for k, v in QualitySettings().to_dict().items() if k != "repetition"}  # job.json before
    assert QualitySettings.from_dict(old).repetition == RepetitionSettings()
