"""Database layer: engines, sessions, column types, ORM models and dialect helpers."""
