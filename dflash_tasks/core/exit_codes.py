"""The exit statuses every command shares (docs/usage.md#exit-status).

A command returns one of these from ``main``; argparse's own refusal of a flag is ``ERROR`` too.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a command's exit status means, the same for every command."""

    #: Done: the job is queued or finished, the check passed, the file was written.
    OK = 0
    #: The command ran but what it watched or checked did not pass: ``verify`` found a problem
    #: (``--strict``: or transient failures left), ``report``'s gates tripped, ``enqueue --wait``
    #: saw the job paused, the node gave every GPU up.
    NOT_PASSED = 1
    #: Nothing was done: bad flags, settings or input, or the broker, store or a server could
    #: not be reached or used.
    ERROR = 2
    #: ``enqueue``: the preflight sample failed the quality gates; the job is paused.
    PREFLIGHT_FAILED = 3
    #: Interrupted (Ctrl-C, 128 + SIGINT); a queued job keeps running.
    INTERRUPTED = 130
