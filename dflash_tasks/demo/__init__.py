"""``python -m dflash_tasks.demo``: the whole pipeline on one machine, with simulated GPUs.

Writes a prompt file in every accepted format (plus a few malformed lines), builds a tiny
tokenizer that fits the simulator's words (:mod:`dflash_tasks.sim.tokenizer`, no download),
starts a node of simulated GPUs (``python -m workers.node --simulate``: one SGLang simulator
serving that model directory and one worker per GPU, which counts each sample's loss tokens with
it, supervised as on a real node), Flower and, once the job is staged, the job's page
(``python -m dflash_tasks.page``), runs ``enqueue --wait`` (live progress bar), checks the
output with ``verify``, prints the trainable yield and the cost per million trainable tokens,
and stops everything it started, on Ctrl-C too.
Redis must already answer at ``DFLASH_BROKER_URL`` (``make demo`` sees to it).
"""

from dflash_tasks.demo.run import main
from dflash_tasks.demo.services import DemoError, check_redis

__all__ = ["DemoError", "check_redis", "main"]
