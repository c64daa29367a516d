"""Celery configuration module for tools that want one (``celery --config celeryconfig``).

The values come from :func:`dflash_tasks.coord.celery_app.celery_config`, built from ``DFLASH_*``
settings, so workers, the producer and Flower always agree.
"""

from dflash_tasks.coord.celery_app import celery_config
from dflash_tasks.core.settings import CommonSettings

globals().update(celery_config(CommonSettings.load()))
