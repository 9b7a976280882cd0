"""The models the operator configured: the registry, and `GET /v1/models`."""
