"""Feedback wire shapes: the request of `PUT .../messages/{id}/feedback` and what the
feedback routes answer."""

from typing import Literal

from pydantic import Field

from app.schemas import InputSchema, Schema

Rating = Literal["good", "bad"]
MAX_COMMENT_CHARS = 4000


class FeedbackInput(InputSchema):
    rating: Rating | None = Field(
        description="`good`, `bad`, or null for none. A null rating without a comment"
        " removes the caller's feedback on the message."
    )
    comment: str | None = Field(default=None, max_length=MAX_COMMENT_CHARS)


class Feedback(Schema):
    session_id: str
    message_id: str
    rating: Rating | None
    comment: str | None
    created_at: str | None = Field(
        default=None, description="Absent when the feedback was removed."
    )
    updated_at: str | None = None


class FeedbackList(Schema):
    data: list[Feedback]
