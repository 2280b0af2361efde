"""Features that plug into queues and exchanges: broadcast, delayed exchange, direct reply-to,
redelivery backoff, the log timer, consumption controls."""
