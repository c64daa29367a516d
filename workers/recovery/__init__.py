"""Recovery: lease heartbeats, the reconciler that re-queues chunks whose worker died, and the
in-place retries of a generated chunk's store write and completion."""
