"""Recovery: lease heartbeats, the reconciler that re-queues chunks whose worker died, the in-place
retries of a generated chunk's store write and completion, what a failed delivery becomes
(re-queued with a growing delay, or parked), and re-queueing itself."""
