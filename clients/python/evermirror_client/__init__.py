"""Async client of the evermirror session service, with the seed's surface:
`Evermirror(base_url=..., api_key=...)`, `client.session(id)`, `session.messages()`,
`session.subscribe()`, `session.sync()`, `send()`, `cancel()` (clients/python/README.md)."""

from evermirror_client._client import Evermirror, Session, Stream, Subscription
from evermirror_client._errors import EvermirrorError
from evermirror_client._sync import SyncStart, SyncView
from evermirror_client._types import (
    DeltaMutation,
    Message,
    MessageMutation,
    Mutation,
    OtherMutation,
    Part,
    PartMutation,
    ResetMutation,
    SessionMessagePage,
)
from evermirror_client._utf16 import utf16_index, utf16_length

__all__ = [
    "DeltaMutation",
    "Evermirror",
    "EvermirrorError",
    "Message",
    "MessageMutation",
    "Mutation",
    "OtherMutation",
    "Part",
    "PartMutation",
    "ResetMutation",
    "Session",
    "SessionMessagePage",
    "Stream",
    "Subscription",
    "SyncStart",
    "SyncView",
    "utf16_index",
    "utf16_length",
]
