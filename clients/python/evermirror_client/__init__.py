"""Async client of the evermirror session service, with the seed's surface:

    from evermirror_client import Evermirror

    async with Evermirror(base_url="http://127.0.0.1:8000", api_key=key) as client:
        session = client.session(session_id)
        page = await session.messages(limit=50)
        async with session.sync() as view:
            await session.send("hello")
            await view.wait_for(lambda ms: ms[-1]["role"] == "agent" and ms[-1]["state"] == "done")
"""

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
