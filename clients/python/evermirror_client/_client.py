"""The client and the session handle: plain calls, and the Mutation stream with
reconnects (`subscribe()`)."""

import asyncio
import json
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, cast
from urllib.parse import quote

import httpx
from httpx_sse import aconnect_sse

from evermirror_client._errors import EvermirrorError, error_of
from evermirror_client._types import (
    Message,
    MessageMutation,
    Mutation,
    SessionMessagePage,
    TurnResult,
    mutation_of,
)

# How long the service waits for a turn when `send_and_wait` does not say.
WAIT_DEFAULT_MS = 120_000

if TYPE_CHECKING:
    from evermirror_client._sync import SyncStart


class Closing:
    """`async with` closes it (`aclose`)."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Evermirror(Closing):
    """A client of one evermirror service.

    `base_url` is the service's address without `/v1`; `api_key` is sent as
    `Authorization: Bearer <key>`. Pass `http_client` to bring your own
    httpx.AsyncClient (its transport, proxies, limits); it is then yours to close.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None = None,
        org_id: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        timeout: float = 30.0,
        retry_seconds: float = 1.0,
        max_retry_seconds: float = 30.0,
        idle_timeout: float = 90.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.org_id = org_id
        self._owns_http = http_client is None
        self.http = http_client or httpx.AsyncClient()
        self.timeout = timeout
        # The pause before reconnecting a stream when the service gave no `retry:`.
        self.retry_seconds = retry_seconds
        self.max_retry_seconds = max_retry_seconds
        # A stream with no byte (not even a heartbeat) for this long is reconnected.
        self.idle_timeout = idle_timeout

    async def aclose(self) -> None:
        if self._owns_http:
            await self.http.aclose()

    def session(self, session_id: str) -> "Session":
        """A handle on one session; no request is made."""
        return Session(self, session_id)

    async def create_session(self, **body: Any) -> "Session":
        """`POST /v1/sessions` (`title`, `tags`, `metadata`, ...): the new session's
        handle, whose `info` is the created session."""
        info = await self.request("POST", "/sessions", body=body)
        return Session(self, info["id"], info)

    async def list_sessions(self, **query: Any) -> dict[str, Any]:
        """`GET /v1/sessions`: upstream's page `{data, total, offset, limit, ...}`."""
        page: dict[str, Any] = await self.request("GET", "/sessions", query=query)
        return page

    async def search(self, q: str, **query: Any) -> dict[str, Any]:
        """`GET /v1/search`: messages whose text holds every word of `q`, best first,
        as `{data, offset, limit, next_url?}`."""
        page: dict[str, Any] = await self.request(
            "GET", "/search", query={**query, "q": q}
        )
        return page

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if self.org_id:
            headers["X-Org-Id"] = self.org_id
        return headers

    def url(self, path: str) -> str:
        return f"{self.base_url}/v1{path}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        read_seconds: float | None = None,
    ) -> Any:
        """One JSON request; a failure status raises EvermirrorError. Transport
        failures raise httpx's own errors. `read_seconds` replaces the client's
        timeout for this request (a request that waits for a turn)."""
        params = {
            name: _query_value(value)
            for name, value in (query or {}).items()
            if value is not None and value is not False
        }
        response = await self.http.request(
            method,
            self.url(path),
            params=params,
            json=body,
            headers=self.headers({"Accept": "application/json"}),
            timeout=self.timeout if read_seconds is None else read_seconds,
        )
        if response.is_error:
            raise error_of(response)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def reconnect_delay(
        self,
        failures: int,
        hint_ms: int | None = None,
        retry_after: int | None = None,
    ) -> float:
        """Seconds before the next connection: the service's hint (`retry:`, or the
        `disconnecting` frame's `retry_ms`) after a clean close; exponential backoff
        with jitter while connecting fails; never less than a `Retry-After`."""
        base = hint_ms / 1000 if hint_ms is not None else self.retry_seconds
        delay = base
        if failures > 0:
            delay = min(self.max_retry_seconds, max(base, 0.001) * 2 ** (failures - 1))
            delay *= random.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, float(retry_after))
        return delay


def _message_body(
    text: str | list[dict[str, Any]],
    client_message_id: str | None,
    visibility: str | None,
    controls: dict[str, Any] | None,
    metadata: dict[str, Any] | None,
    tags: list[str] | None,
) -> dict[str, Any]:
    content = [{"type": "text", "text": text}] if isinstance(text, str) else text
    message: dict[str, Any] = {"content": content}
    if visibility is not None:
        message["visibility"] = visibility
    body: dict[str, Any] = {"message": message}
    for name, value in (
        ("client_message_id", client_message_id),
        ("controls", controls),
        ("metadata", metadata),
        ("tags", tags),
    ):
        if value is not None:
            body[name] = value
    return body


def _query_value(value: Any) -> str:
    if value is True:
        return "true"
    return str(value)


class Stream:
    """One open connection of the Mutation stream. Iterating it gives its Mutations
    until the service closes it (or announces that it will, with `disconnecting`)."""

    def __init__(self, events: Any) -> None:
        self._events = events
        # The service's reconnect hint in milliseconds, once it gave one.
        self.retry_ms: int | None = None

    async def __aiter__(self) -> AsyncIterator[Mutation]:
        async for sse in self._events.aiter_sse():
            if sse.retry is not None:
                self.retry_ms = sse.retry
            # A block without data dispatches no event (WHATWG); httpx-sse yields one
            # for every `: ping` once an id was seen.
            if not sse.data:
                continue
            try:
                data = json.loads(sse.data)
            except ValueError:
                continue
            if sse.event == "disconnecting":
                # The service is about to close: reconnect now, after the pause it asks.
                if isinstance(data, dict) and isinstance(data.get("retry_ms"), int):
                    self.retry_ms = data["retry_ms"]
                return
            mutation = mutation_of(sse.event, data, sse.id)
            if mutation is not None:
                yield mutation


SubscriptionStatus = Literal["connecting", "open", "reconnecting", "closed"]


class Session:
    """One session of the service."""

    def __init__(
        self, client: Evermirror, session_id: str, info: dict[str, Any] | None = None
    ) -> None:
        self.client = client
        self.id = session_id
        # The session as last read (create_session, get, update); None until then.
        self.info = info

    def _path(self, suffix: str = "") -> str:
        return f"/sessions/{quote(self.id, safe='')}{suffix}"

    async def get(self) -> dict[str, Any]:
        self.info = await self.client.request("GET", self._path())
        return cast(dict[str, Any], self.info)

    async def update(self, **patch: Any) -> dict[str, Any]:
        self.info = await self.client.request("PATCH", self._path(), body=patch)
        return cast(dict[str, Any], self.info)

    async def delete(self) -> None:
        await self.client.request("DELETE", self._path())

    async def pin(self, pinned: bool = True) -> None:
        """`PUT` (True) or `DELETE` (False) `.../pin`: the session's `is_pinned`."""
        await self.client.request("PUT" if pinned else "DELETE", self._path("/pin"))

    async def archive(self, archived: bool = True) -> None:
        """`PUT` (True) or `DELETE` (False) `.../archive`: out of the default list."""
        await self.client.request(
            "PUT" if archived else "DELETE", self._path("/archive")
        )

    async def rate(
        self,
        message_id: str,
        rating: Literal["good", "bad"] | None,
        comment: str | None = None,
    ) -> dict[str, Any]:
        """This key's feedback on a message; no rating and no comment remove it."""
        path = self._path(f"/messages/{quote(message_id, safe='')}/feedback")
        body = {"rating": rating, "comment": comment}
        return cast(dict[str, Any], await self.client.request("PUT", path, body=body))

    async def feedback(self) -> list[dict[str, Any]]:
        """This key's feedback on the session's messages, in their order."""
        answer = await self.client.request("GET", self._path("/feedback"))
        return cast(list[dict[str, Any]], answer["data"])

    async def messages(
        self,
        *,
        limit: int | None = None,
        before_sequence: int | None = None,
        include_internal: bool = False,
    ) -> SessionMessagePage:
        """The seed's SessionMessagePage: the newest `limit` messages (50 by default,
        at most 200) before `before_sequence`, oldest first."""
        body = await self.client.request(
            "GET",
            self._path("/messages"),
            query={
                "limit": limit,
                "before_sequence": before_sequence,
                "include_internal": include_internal,
            },
        )
        return SessionMessagePage(
            items=body["data"],
            total=body["total"],
            has_more=body["has_more"],
            start_sequence=body.get("start_sequence"),
            end_sequence=body.get("end_sequence"),
            next_before_sequence=body.get("next_before_sequence"),
            cursor=body.get("cursor"),
        )

    async def message(self, message_id: str) -> Message:
        return cast(
            Message,
            await self.client.request(
                "GET", self._path(f"/messages/{quote(message_id, safe='')}")
            ),
        )

    async def send(
        self,
        text: str | list[dict[str, Any]],
        *,
        client_message_id: str | None = None,
        visibility: str | None = None,
        controls: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> Message:
        """Posts a user message (a text, or content parts). The answer is the stored
        message with `delivery`: started, steered or duplicate."""
        body = _message_body(
            text, client_message_id, visibility, controls, metadata, tags
        )
        return cast(
            Message,
            await self.client.request("POST", self._path("/messages"), body=body),
        )

    async def send_and_wait(
        self,
        text: str | list[dict[str, Any]],
        *,
        timeout_ms: int | None = None,
        client_message_id: str | None = None,
        visibility: str | None = None,
        controls: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        tags: list[str] | None = None,
    ) -> TurnResult:
        """Posts a user message and answers when its turn ends (`?wait=true`):
        `status` is completed or failed (`error` says why), waiting as soon as the
        turn waits for this client (`waiting_for`: `tool_results` or `approval`), or
        timeout after `timeout_ms` (the service's default is 120000); `message` is the
        posted message, `messages` the turn's agent messages."""
        body = _message_body(
            text, client_message_id, visibility, controls, metadata, tags
        )
        # The request lasts as long as the wait, and a little longer.
        waiting = (timeout_ms if timeout_ms is not None else WAIT_DEFAULT_MS) / 1000
        answer = await self.client.request(
            "POST",
            self._path("/messages"),
            query={"wait": True, "timeout_ms": timeout_ms},
            body=body,
            read_seconds=waiting + self.client.timeout,
        )
        return TurnResult(
            answer["status"],
            answer["message"],
            answer.get("messages", []),
            answer.get("error"),
            answer.get("waiting_for"),
        )

    async def cancel(self) -> dict[str, Any]:
        """Stops the running turn: `{"status": "cancelled" | "no_op", "message"}`."""
        answer: dict[str, Any] = await self.client.request(
            "POST", self._path("/cancel")
        )
        return answer

    async def submit_tool_results(
        self, results: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """`POST .../tool-results`: results of client-side tool calls
        (`[{tool_call_id, result?, error?}]`); `{"accepted", "status"}`."""
        answer: dict[str, Any] = await self.client.request(
            "POST", self._path("/tool-results"), body={"tool_results": results}
        )
        return answer

    async def interactions(self, status: str | None = None) -> list[dict[str, Any]]:
        """`GET .../interactions`: the session's approvals, oldest first."""
        query = {"status": status} if status is not None else None
        page: dict[str, Any] = await self.client.request(
            "GET", self._path("/interactions"), query=query
        )
        items: list[dict[str, Any]] = page["data"]
        return items

    async def respond(
        self, interaction_id: str, decision: str, reason: str | None = None
    ) -> dict[str, Any]:
        """`POST .../interactions/{id}`: approve or deny a pending approval."""
        body: dict[str, Any] = {"decision": decision}
        if reason is not None:
            body["reason"] = reason
        answer: dict[str, Any] = await self.client.request(
            "POST", self._path(f"/interactions/{interaction_id}"), body=body
        )
        return answer

    def subscribe(
        self,
        *,
        after: str | int | None = None,
        include_internal: bool = False,
        on_status: Callable[[SubscriptionStatus], None] | None = None,
    ) -> "Subscription":
        """The Mutation stream as an async iterator that reconnects by itself,
        resuming with `Last-Event-ID`. `after="0"` starts with every message.
        `on_status` is called with each new `status` (`open`, `reconnecting`,
        `closed`); a refusal is raised by the iteration."""
        return Subscription(
            self,
            after=None if after is None else str(after),
            include_internal=include_internal,
            on_status=on_status,
        )

    def sync(self, *, limit: int = 50, include_internal: bool = False) -> "SyncStart":
        """A live view of the newest messages that follows the seed's sync rules:
        `view = await session.sync()`, or `async with session.sync() as view:`."""
        from evermirror_client._sync import SyncStart

        return SyncStart(self, limit=limit, include_internal=include_internal)

    @asynccontextmanager
    async def open_stream(
        self,
        *,
        cursor: str | None = None,
        after: str | None = None,
        include_internal: bool = False,
    ) -> AsyncIterator[Stream]:
        """One connection of the Mutation stream; EvermirrorError if the service
        refused it. A reconnect names its cursor in `Last-Event-ID` only, never also
        in `?after=`, so it is honoured whichever of the two a server prefers."""
        client = self.client
        headers = client.headers()
        params: dict[str, str] = {}
        if cursor is not None:
            headers["Last-Event-ID"] = cursor
        elif after is not None:
            params["after"] = after
        if include_internal:
            params["include_internal"] = "true"
        timeout = httpx.Timeout(client.timeout, read=client.idle_timeout)
        async with aconnect_sse(
            client.http,
            "GET",
            client.url(self._path("/messages/stream")),
            params=params,
            headers=headers,
            timeout=timeout,
        ) as events:
            response = events.response
            if response.status_code != 200:
                await response.aread()
                raise error_of(response)
            yield Stream(events)


class Subscription(Closing):
    """`session.subscribe()`: iterate it for Mutations (`async for m in sub`); it
    reconnects after a close or a network failure, and raises EvermirrorError when the
    service refuses the stream for good (401, 404, ...). Close it with `aclose()` or
    use it as an async context manager."""

    def __init__(
        self,
        session: Session,
        *,
        after: str | None,
        include_internal: bool,
        on_status: Callable[[SubscriptionStatus], None] | None = None,
    ):
        self.session = session
        self.after = after
        self.include_internal = include_internal
        self.on_status = on_status
        # The cursor of the last `message` Mutation: where a reconnect resumes.
        self.last_event_id: str | None = None
        self.status: SubscriptionStatus = "connecting"
        self._iterator = self._run()

    def _set_status(self, status: SubscriptionStatus) -> None:
        if status != self.status:
            self.status = status
            if self.on_status is not None:
                self.on_status(status)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Mutation:
        return await self._iterator.__anext__()

    async def aclose(self) -> None:
        await self._iterator.aclose()
        self._set_status("closed")

    async def _run(self) -> AsyncGenerator[Mutation, None]:
        client = self.session.client
        failures = 0
        try:
            while True:
                hint: int | None = None
                retry_after: int | None = None
                try:
                    async with self.session.open_stream(
                        cursor=self.last_event_id,
                        after=self.after,
                        include_internal=self.include_internal,
                    ) as stream:
                        failures = 0
                        self._set_status("open")
                        async for mutation in stream:
                            if (
                                isinstance(mutation, MessageMutation)
                                and mutation.cursor
                            ):
                                self.last_event_id = mutation.cursor
                            yield mutation
                    hint = stream.retry_ms
                except EvermirrorError as error:
                    if not error.retryable:
                        raise
                    failures += 1
                    retry_after = error.retry_after
                except httpx.TransportError:
                    failures += 1
                self._set_status("reconnecting")
                await asyncio.sleep(client.reconnect_delay(failures, hint, retry_after))
        finally:
            self._set_status("closed")
