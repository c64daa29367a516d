"""Pure building blocks, no Redis, Celery or HTTP: errors, settings, the job spec, quality checks."""
