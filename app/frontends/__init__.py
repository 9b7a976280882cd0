"""Frontend protocols over the session log: the AI SDK's UI message stream."""
