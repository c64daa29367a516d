"""Flow control in a worker: the request pool, prefetch, the consumer switch, the health gate."""
