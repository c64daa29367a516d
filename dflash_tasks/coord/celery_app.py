"""The Celery application and its reliability settings.

Every process that talks to the broker uses the same values (a mismatched visibility timeout
on one consumer causes duplicate deliveries everywhere): they all come from the fields every
role shares, :class:`~dflash_tasks.core.settings.CommonSettings`.
``celery -A dflash_tasks.coord.celery_app flower`` works as is.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from dflash_tasks.core.settings import CommonSettings

TASK_NAME = "dflash.run_chunk"


def celery_config(settings: CommonSettings) -> dict[str, Any]:
    """Celery settings for long chunk tasks on Redis (see the README's reliability section)."""
    vt = settings.visibility_timeout
    transport = {
        "visibility_timeout": vt,
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 3,
        "health_check_interval": 25,
    }
    return {
        "broker_url": settings.broker_url,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": transport,
        "result_backend": None,
        "result_backend_transport_options": {"visibility_timeout": vt},
        "visibility_timeout": vt,
        # Delivery: ack after the chunk is stored; a killed worker's chunk is redelivered.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        # Wire format: JSON only; a pickled message is refused.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        # Results live in the store, never in Redis.
        "task_ignore_result": True,
        "task_store_errors_even_if_ignored": False,
        # Routing: every chunk is published to its model's queue (coord/routing.py); the base
        # queue is only the default, which workers also consume to forward strays.
        "task_default_queue": settings.queue,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
    }


def consumer_event_loop() -> Any:
    """The kombu event loop of the worker's consumer (None outside one): where QoS changes run."""
    from kombu.asynchronous import get_event_loop

    return get_event_loop()


def configure(app: Celery, settings: CommonSettings) -> Celery:
    """Apply ``settings`` to ``app`` (entry points call this after parsing their flags)."""
    app.conf.update(celery_config(settings))
    return app


app = Celery("dflash_tasks")
configure(app, CommonSettings.load())
