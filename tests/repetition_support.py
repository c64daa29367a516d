"""Texts for the repetition detector's tests and benchmark: the corpus of long natural reasoning
with legitimate repetition (``tests/core/data/reasoning/*.md``), loops as models fall into them,
and a tokenizer close enough to a BPE's granularity (a word with its leading space, a run of
punctuation, a run of whitespace: about 4 characters a token in English)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from dflash_tasks.core.repetition import Loop, RepetitionDetector, RepetitionSettings

CORPUS_DIR = Path(__file__).resolve().parent / "core" / "data" / "reasoning"
BUDGET = 4096  # max_tokens of the loop tests: a loop must be seen well within a quarter of it

_TOKEN = re.compile(r" ?\w+| ?[^\w\s]+|\s+")

#: A sentence, a paragraph and a short phrase, each repeated as a looping model repeats them.
SENTENCE = "Wait, I need to recompute the sum of the first row before moving on to the next step. "
PARAGRAPH = (
    "So the total is the sum over all pairs, which is n(n - 1)/2, and each pair contributes at most "
    "one edge. Therefore the graph has at most n(n - 1)/2 edges. But we also need the triangle-free "
    "condition, which by Mantel's theorem caps the number of edges at n^2/4. Let me reconsider "
    "whether this bound is tight. For even n the complete bipartite graph K(n/2, n/2) attains it, "
    "so the answer should be n^2/4.\n\n"
)
PHRASE = "wait, "
#: A long paragraph, about 250 tokens: a loop of it is seen after two copies.
LONG_PARAGRAPH = (
    PARAGRAPH.strip()
    + " "
    + (
        "Hmm, but the problem counts labelled graphs, not the maximum number of edges. Let me go back "
        "to the statement: it asks how many triangle-free graphs on n labelled vertices have exactly "
        "n^2/4 edges. By the stability version of Mantel's theorem, every extremal graph is complete "
        "bipartite with parts of sizes n/2 and n/2, so we only need to count the ways to split the "
        "vertices into two equal parts, which is C(n, n/2)/2, since swapping the parts gives the same "
        "graph. For n = 4 that is C(4, 2)/2 = 3, and indeed the three 4-cycles on four labelled "
        "vertices are the only triangle-free graphs with four edges.\n\n"
    )
)


def corpus() -> dict[str, str]:
    """The corpus: name -> text."""
    return {path.stem: path.read_text() for path in sorted(CORPUS_DIR.glob("*.md"))}


def tokens(text: str) -> list[str]:
    """``text`` cut into token-sized pieces that join back into it."""
    return _TOKEN.findall(text)


def deltas(text: str, per_chunk: int = 1) -> Iterator[str]:
    """``text`` as a stream sends it: ``per_chunk`` tokens a delta."""
    pieces = tokens(text)
    for at in range(0, len(pieces), per_chunk):
        yield "".join(pieces[at : at + per_chunk])


def stream(
    text: str, settings: RepetitionSettings | None = None, per_chunk: int = 1
) -> tuple[Loop | None, RepetitionDetector]:
    """Feed ``text`` delta by delta, as the worker will; the first loop seen (None at the end of a
    text without one) and the detector."""
    detector = RepetitionDetector(settings)
    for delta in deltas(text, per_chunk):
        found = detector.feed(delta, len(tokens(delta)))
        if found is not None:
            return found, detector
    return detector.flush(), detector


def looping(prefix: str, unit: str, budget: int = BUDGET) -> str:
    """``prefix``, then ``unit`` repeated until ``budget`` tokens: a model that fell into a loop."""
    per_unit = len(tokens(unit))
    copies = max(1, (budget - len(tokens(prefix))) // per_unit + 1)
    return prefix + unit * copies
