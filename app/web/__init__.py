"""The web view (see router.py)."""
