"""Feedback on messages: a caller's rating and comment, one per message and API key."""
