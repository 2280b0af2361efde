"""Queues: the per-queue runtime (offsets, unacked, consumers), its kinds and behaviours, and
the push scheduler. Below sessions and features: nothing here imports them."""
