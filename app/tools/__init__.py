"""Tools: the tool life cycle, session tool definitions and client-side tool results."""
