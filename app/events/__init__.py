"""The durable event log: upstream's event types, appends inside checkpoints, and reads."""
