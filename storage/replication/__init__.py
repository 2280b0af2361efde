"""A replicated group's broker side: the store gated by its role, the member's life in
the group, what it remembers across a crash, the commitlog as replication moves it."""
