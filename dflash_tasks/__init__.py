"""dflash-tasks: distillation datasets from SGLang servers, through Celery and Redis, exactly once."""

__version__ = "0.1.0"
