"""The gateway's side of brokers: one broker (remote), a replicated group (group), several
groups routed per queue partition (routed)."""
