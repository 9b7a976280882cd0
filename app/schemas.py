"""Shared schema bases: inputs ignore unknown fields (upstream clients send more than we use)."""

from pydantic import BaseModel, ConfigDict


class Schema(BaseModel):
    """Wire output shapes (documentation of stored JSON; reads serve stored bytes)."""

    model_config = ConfigDict(extra="allow")


class InputSchema(BaseModel):
    """Request bodies: unknown fields are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")
