"""Live machinery: the fan-out bus, in-memory projections of streaming messages, SSE."""
