"""HTTP to an OpenAI-compatible provider (`OPENAI_BASE_URL`), over aiohttp.

The `openai` driver's two requests: a streamed Chat Completion, whose body is handed
over as its bytes arrive (`chat_stream` splits and decodes it), and the one completion
a summary asks for. Both are JSON over one pooled aiohttp session. The `openai`
package's client (its request building, httpx's pool and per-read layers) cost 14 ms
of CPU per streamed request of 40 chunks at 50 at once, against 2 ms here: more than
the rest of a token's way to its watchers (docs/performance.md).

What a client library did for the driver is done here: the key sent as a bearer token;
one deadline (MODEL_TIMEOUT_SECONDS) for connecting and for the answer's status line
and headers; a redirect answered, not followed (following it would send the key to
wherever it points); HTTP_PROXY, HTTPS_PROXY and NO_PROXY from the environment, read
once; the system's certificate authorities and certifi's; and every failure raised as a
`ProviderError`: its status or kind, its message cut to its start, whether another
attempt may succeed, and when (Retry-After).
"""

import asyncio
import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import certifi
import orjson
from aiohttp.helpers import get_env_proxy_for_url
from multidict import CIMultiDictProxy
from yarl import URL

from app.db.types import utcnow

# Statuses another attempt may get past, besides every 5xx.
RETRIED_STATUSES = frozenset({408, 409, 429})
# How much of an error answer's body is read; a provider, or a proxy in front of one,
# answering megabytes is not read into memory.
MAX_ERROR_BODY_BYTES = 64 * 1024
# How much of a provider's error message is kept (stored in the error part, logged).
MAX_ERROR_CHARS = 1_000
# A non-streamed answer (a summary) past this size is refused.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
# Connections to the provider: as many as turns stream at once, kept for reuse.
MAX_CONNECTIONS = 1_000


class ProviderError(Exception):
    """A failed request: its status (or kind) and whether another attempt may succeed."""

    def __init__(
        self, code: str, message: str, retryable: bool, after: float | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable
        self.after = after


def timed_out() -> ProviderError:
    return ProviderError("timeout", "The model provider did not answer in time", True)


def connection_failed(exc: BaseException) -> ProviderError:
    return ProviderError(
        "connection_error",
        f"The connection to the model provider failed: {type(exc).__name__}",
        True,
    )


def stream_failed(message: str) -> ProviderError:
    """The provider failed mid-answer (an `error` object in the stream, or a stream
    that is not one): tried again."""
    return ProviderError(
        "stream_error",
        f"The model provider failed: {message[:MAX_ERROR_CHARS]}",
        True,
    )


# Failures of the connection while a request is sent or its answer read.
TRANSPORT_ERRORS = (aiohttp.ClientError, OSError)


def _proxy_for(url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The proxy the environment names for the provider's URL (HTTP_PROXY, HTTPS_PROXY,
    NO_PROXY; credentials in the proxy's URL or ~/.netrc), the way aiohttp's
    `trust_env` reads it, but once: `trust_env` reads the environment and ~/.netrc again
    for every request, in two trips to a thread (5 % of the CPU of a streamed turn of
    40 tokens), and would also send ~/.netrc's login for the provider's host, which the
    bearer token excludes."""
    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None


class Provider:
    """One provider's endpoint and the pooled connections to it."""

    def __init__(
        self, base_url: str, api_key: str | None, timeout_seconds: float
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.timeout_seconds = timeout_seconds
        self.headers = {
            # Local servers take any key; a header without one is refused by some.
            "Authorization": f"Bearer {api_key or 'none'}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        # Loading certificates takes tens of milliseconds: at start-up, not on the event
        # loop's first request.
        self._tls = ssl.create_default_context()
        self._tls.load_verify_locations(certifi.where())
        self._session: aiohttp.ClientSession | None = None
        self._proxy, self._proxy_auth = _proxy_for(self.url)

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use: a session belongs to the event loop it was made in.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=self._tls),
                # Each phase has its own deadline here (`_send`, the reader's).
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
                auto_decompress=True,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @asynccontextmanager
    async def stream(self, body: dict[str, Any]) -> AsyncIterator[AsyncIterator[bytes]]:
        """The answer's body, as its bytes arrive. Leaving the block before its end
        (a failure, or the runner closing a cancelled step) closes the connection, so
        the provider stops generating at once; one read to its end is kept for reuse."""
        response = await self._send(body)
        try:
            yield _pieces(response)
        except BaseException:
            response.close()
            raise
        if response.content.at_eof():
            response.release()
        else:
            response.close()

    async def complete(self, body: dict[str, Any]) -> Any:
        """A non-streamed answer, decoded."""
        response = await self._send(body)
        try:
            async with asyncio.timeout(self.timeout_seconds):
                raw = await _read_capped(response, MAX_ANSWER_BYTES + 1)
        except TimeoutError as exc:
            raise timed_out() from exc
        except TRANSPORT_ERRORS as exc:
            raise connection_failed(exc) from exc
        finally:
            response.close()
        if len(raw) > MAX_ANSWER_BYTES:
            raise stream_failed(f"an answer of more than {MAX_ANSWER_BYTES:,} bytes")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise stream_failed(f"an answer that is not JSON ({exc})") from exc

    async def _send(self, body: dict[str, Any]) -> aiohttp.ClientResponse:
        """The answer's status and headers, a 2xx; any other is a ProviderError."""
        try:
            async with asyncio.timeout(self.timeout_seconds):
                response = await self._client().post(
                    self.url,
                    data=orjson.dumps(body),
                    headers=self.headers,
                    allow_redirects=False,
                    proxy=self._proxy,
                    proxy_auth=self._proxy_auth,
                )
        except TimeoutError as exc:
            raise timed_out() from exc
        except TRANSPORT_ERRORS as exc:
            raise connection_failed(exc) from exc
        if response.status < 300:
            return response
        try:
            async with asyncio.timeout(self.timeout_seconds):
                kept = await _read_capped(response, MAX_ERROR_BODY_BYTES)
        except (TimeoutError, *TRANSPORT_ERRORS):
            kept = b""
        finally:
            response.close()
        raise status_error(response.status, response.reason, response.headers, kept)


async def _pieces(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body's pieces as they arrive; a failed read is a ProviderError."""
    content = response.content
    while True:
        try:
            piece = await content.readany()
        except TRANSPORT_ERRORS as exc:
            raise connection_failed(exc) from exc
        if not piece:
            return
        yield piece


async def _read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most `limit` bytes of the body (the rest is left unread)."""
    kept = bytearray()
    while len(kept) < limit:
        piece = await response.content.read(limit - len(kept))
        if not piece:
            break
        kept += piece
    return bytes(kept)


def status_error(
    status: int,
    reason: str | None,
    headers: "CIMultiDictProxy[str]",
    body: bytes,
) -> ProviderError:
    detail = _message(body) or reason or ""
    return ProviderError(
        str(status),
        f"The model provider answered {status}: {detail[:MAX_ERROR_CHARS]}",
        status in RETRIED_STATUSES or status >= 500,
        retry_after(headers),
    )


# The start of an error's `message` in a body that is not whole JSON (cut at
# MAX_ERROR_BODY_BYTES): `{"error": {"message": "...`.
MESSAGE_TEXT = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)')


def _message(body: bytes) -> str | None:
    """An error answer's message: `error.message` (or `message`, or `error` itself as
    text) of a JSON body, else the start of a `message` in the text, else the text."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
        found = MESSAGE_TEXT.search(text)
        return found.group(1) if found else text or None
    if not isinstance(parsed, dict):
        return None
    error = parsed.get("error", parsed)
    if isinstance(error, str):
        return error or None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message else None


def retry_after(headers: "CIMultiDictProxy[str]") -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), or OpenAI's
    `retry-after-ms`."""
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(value) - utcnow()).total_seconds())
    except (TypeError, ValueError):
        return None
