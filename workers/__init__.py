"""Worker entry points: ``python -m workers`` runs one Celery worker bound to one SGLang endpoint."""
