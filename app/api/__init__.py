"""The HTTP edge: every route, the dependencies routes take, the application state they read, and the hot front door in front of FastAPI."""
