"""Benchmarks of dflash-tasks: ``python -m benchmarks [name ...] [--quick] [--repeat N]``.

Each benchmark is a module of this package with a ``BENCHMARK`` (:class:`benchmarks.common.Benchmark`):
it runs real processes (a private ``redis-server``, simulators, ``python -m workers``, ``python -m
dflash_tasks.producer.enqueue``), returns flat figures, and states its goals. The runner writes
``benchmarks/results/<name>.json``, prints the figures and exits non-zero when a goal is missed.

* ``saturation``  the full pipeline against a direct client on the same simulated servers
* ``scale``       staging, queueing and re-planning a 913,786-prompt input
* ``overhead``    per-chunk and per-sample cost of one worker against an instant simulator
"""
