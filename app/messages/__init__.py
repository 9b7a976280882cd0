"""Messages: the data-wrapped Message schema, checkpoints and pagination."""
