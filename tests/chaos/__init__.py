"""The chaos run: overlapping faults on a live multi-node job, a checker over the whole history.

``python -m tests.chaos --minutes N --seed S`` (``make chaos CHAOS_ARGS='...'``) starts a private
Redis, an output store, several simulated GPU nodes (``python -m workers.node --simulate``; some
inside network namespaces so they can be cut off) and a producer, then injects the faults of a
seeded schedule (:mod:`tests.chaos.schedule`) through the nemeses of :mod:`tests.chaos.nemeses`,
records a history (:mod:`tests.chaos.history`) and checks it at the end
(:mod:`tests.chaos.checker`). See ``docs/reliability.md``.
"""
