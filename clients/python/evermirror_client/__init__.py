"""Async client of the evermirror session service, with the seed's surface:
`Evermirror(base_url=..., api_key=...)`, `client.session(id)`, `session.messages()`,
`session.subscribe()`, `session.sync()`, `send()`, `send_and_wait()`, `cancel()` (clients/python/README.md)."""

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
    SessionMutation,
    TurnMutation,
    TurnResult,
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
    "SessionMutation",
    "Stream",
    "Subscription",
    "SyncStart",
    "SyncView",
    "TurnMutation",
    "TurnResult",
    "utf16_index",
    "utf16_length",
]
