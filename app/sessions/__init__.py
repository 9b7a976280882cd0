"""Sessions: create, list, read, update, delete and cancel."""
