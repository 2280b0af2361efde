"""The log store: one commitlog, per-partition consume queues, offsets, recovery, upkeep."""
