"""``enqueue`` and ``resume`` say when no live worker serves the job's model, and when one does."""

from __future__ import annotations

import io

import redis

from dflash_tasks.coord.bookkeeping import Bookkeeping
from dflash_tasks.coord.keys import Keys
from dflash_tasks.producer.serving import CHECK_SECONDS, ServingWatch
from tests.helpers import redis_url


def beat(model: str) -> dict[str, str]:
    return {"last_seen": "9e18", "beat_s": "2", "model": model, "model_path": model}


def test_serving_watch_says_when_it_starts_changes_and_ends(rclient: redis.Redis, prefix: str) -> None:
    keys, out = Keys(prefix), io.StringIO()
    clock = [0.0]
    bk = Bookkeeping.from_url(redis_url(rclient), prefix)
    watch = ServingWatch(bk, "Model-A", stream=out, clock=lambda: clock[0])
    rclient.sadd(keys.workers(), "gpu0@a")
    rclient.hset(keys.worker("gpu0@a"), mapping=beat("Org/Model-B"))
    assert watch.poll() is not None
    clock[0] += 1.0  # not due yet: nothing read, nothing said
    rclient.hset(keys.worker("gpu0@a"), "model", "Org/Model-C")
    watch.poll()
    clock[0] += CHECK_SECONDS
    watch.poll()
    watch.poll()  # unchanged: said once
    clock[0] += CHECK_SECONDS
    rclient.hset(keys.worker("gpu0@a"), mapping={"model": "Model-A", "model_path": "/m/Model-A"})
    assert watch.poll() is None
    lines = out.getvalue().splitlines()
    said = "warning: no live worker serves model 'Model-A'"
    assert [line.split(";")[0] for line in lines[:2]] == [said, said]
    assert "Org/Model-B (1 worker)" in lines[0] and "Org/Model-C (" in lines[1]
    assert lines[2:] == ["a live worker serves model 'Model-A' now"]
