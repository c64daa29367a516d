"""One queue per model: the queue names, and where published chunks land in Redis."""

from __future__ import annotations

import pytest
import redis
from celery import Celery

from dflash_tasks.coord.celery_app import configure
from dflash_tasks.coord.publish import publish_chunks, queued_chunks
from dflash_tasks.coord.routing import model_queue, server_queues
from dflash_tasks.core.errors import ConfigError
from dflash_tasks.core.settings import CommonSettings
from tests.helpers import redis_url

JOB = "0123456789abcdef"


def test_model_queue_is_the_base_and_the_model_key() -> None:
    assert model_queue("dflash", "Qwen/Qwen3-8B") == "dflash.qwen3-8b"
    assert model_queue("dflash", "Qwen3-8B") == "dflash.qwen3-8b"
    assert model_queue("gpu-q", "/dev/shm/models/Qwen3.6-27B") == "gpu-q.qwen3.6-27b"
    with pytest.raises(ConfigError, match="no routing key"):
        model_queue("dflash", "/")


def test_a_worker_consumes_its_model_queues_then_the_base_queue() -> None:
    assert server_queues("dflash", "/dev/shm/models/Qwen3-8B", "/dev/shm/models/Qwen3-8B") == [
        "dflash.qwen3-8b",
        "dflash",
    ]
    assert server_queues("dflash", "qwen-27b", "/m/Qwen3.6-27B") == [
        "dflash.qwen-27b",
        "dflash.qwen3.6-27b",
        "dflash",
    ]
    assert server_queues("dflash", "", "") == ["dflash"]  # the model is not known yet


def test_every_job_model_a_server_matches_routes_to_a_queue_it_consumes() -> None:
    consumed = set(server_queues("dflash", "qwen-27b", "/dev/shm/models/Qwen3.6-27B"))
    for job_model in ("qwen-27b", "Qwen3.6-27B", "Qwen/Qwen3.6-27B", "QWEN3.6-27B"):
        assert model_queue("dflash", job_model) in consumed
    assert model_queue("dflash", "Qwen/Qwen3-8B") not in consumed


def test_chunks_land_in_their_model_queue_only(rclient: redis.Redis, prefix: str) -> None:
    base = f"{prefix}-q"  # its keys are deleted with the prefix
    app = Celery("ut-routing", set_as_current=False)
    configure(app, CommonSettings.load({}, broker_url=redis_url(rclient), queue=base))
    a, b = model_queue(base, "Org/Model-A"), model_queue(base, "/models/Model-B")
    try:
        assert publish_chunks(app, JOB, [0, 1, 2], queue=a) == 3  # the pipelined batch path
        assert publish_chunks(app, JOB, [7], queue=b) == 1  # the single (re-queue) path
    finally:
        app.close()
    assert (rclient.llen(a), rclient.llen(b), rclient.llen(base)) == (3, 1, 0)
    assert queued_chunks(rclient, a, JOB) == {0, 1, 2}
    assert queued_chunks(rclient, b, JOB) == {7}
