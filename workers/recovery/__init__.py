"""Recovery: lease heartbeats and the reconciler that re-queues chunks whose worker died."""
