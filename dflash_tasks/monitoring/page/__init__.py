"""The job's own page (``python -m dflash_tasks.page``): a run, its GPUs and its samples, in a browser."""
