"""What operators see: counters and rates, the firehose, OpenTelemetry tracing, and the taps
that switch them per session."""
