"""`If-None-Match: *` on a GET (RFC 9110 §13.1.2): a resource that has a current
representation fails the condition, so what would be a 200 is a 304 without a body.
The messages page evaluates its ETags (and `*`) itself, on both paths; this covers
the routes that carry no ETag. Event streams are left alone: a 304 would end an
EventSource for good."""

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Representation headers a 304 does not carry (RFC 9110 §15.4.5).
DROPPED = {b"content-length", b"content-type"}


def _star(scope: Scope) -> bool:
    return any(
        name == b"if-none-match" and value.strip() == b"*"
        for name, value in scope["headers"]
    )


class IfNoneMatchStarMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or not _star(scope):
            await self.app(scope, receive, send)
            return
        not_modified = False

        async def send_304(message: Message) -> None:
            nonlocal not_modified
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                media = dict(headers).get(b"content-type", b"")
                if message["status"] == 200 and not media.startswith(
                    b"text/event-stream"
                ):
                    not_modified = True
                    message = {
                        **message,
                        "status": 304,
                        "headers": [(k, v) for k, v in headers if k not in DROPPED],
                    }
            elif message["type"] == "http.response.body" and not_modified:
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        await self.app(scope, receive, send_304)
