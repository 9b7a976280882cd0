"""Shared schema bases: inputs ignore unknown fields (upstream clients send more than we use)."""

from pydantic import BaseModel, ConfigDict

# Sequences and offsets are int32 (upstream's `format: int32`, PostgreSQL `integer`):
# a larger query value is a 400, not a database overflow.
MAX_INT32 = 2**31 - 1


class Schema(BaseModel):
    """Wire output shapes (documentation of stored JSON; reads serve stored bytes)."""

    model_config = ConfigDict(extra="allow")


class InputSchema(BaseModel):
    """Request bodies: unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")
