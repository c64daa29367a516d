"""Every command: its console script (``pyproject.toml``'s ``[project.scripts]``) and the module
``python -m`` runs. Both run the same ``main``; a test holds ``pyproject.toml`` to this table."""

from __future__ import annotations

import os
import sys

#: console script -> the module ``python -m`` runs, whose ``main`` the script calls.
COMMANDS: dict[str, str] = {
    "dflash-enqueue": "dflash_tasks.enqueue",
    "dflash-resume": "dflash_tasks.resume",
    "dflash-status": "dflash_tasks.status",
    "dflash-page": "dflash_tasks.page",
    "dflash-flower": "dflash_tasks.flower",
    "dflash-verify": "dflash_tasks.verify",
    "dflash-report": "dflash_tasks.report",
    "dflash-export": "dflash_tasks.export",
    "dflash-demo": "dflash_tasks.demo",
    "dflash-sim": "dflash_tasks.sim",
    "dflash-worker": "workers",
    "dflash-node": "workers.node",
}


def prog(module: str) -> str:
    """The name a command's usage line shows: the console script it was started as, else
    ``python -m <module>``."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv else ""
    if COMMANDS.get(invoked) == module:
        return invoked
    return f"python -m {module}"
