"""The job's own page: a small Tornado app showing a run, its GPUs and its samples (``python -m dflash_tasks.page``)."""
