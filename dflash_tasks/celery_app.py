"""``celery -A dflash_tasks.celery_app ...``: the Celery app, for the ``celery`` command (Flower, inspect)."""

from dflash_tasks.coord.celery_app import app

__all__ = ["app"]
