"""The turn runner and its model drivers."""
