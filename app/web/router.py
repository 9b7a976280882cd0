"""The web view: the session list at `/sessions` and the chat page at
`/sessions/{id}/chat` (every session's `view_url`), static files built on the
JavaScript client, which is served from the same origin under `/web/client/`. `/`
sends a browser to the session list.

None of it is in the OpenAPI document, and none of it reads the database: the pages
call the public API with the caller's key, like any other client. Unknown paths stay
the API's problem+json 404s.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import RedirectResponse

from app.errors import NotFound
from app.ids import parse_or_400

HERE = Path(__file__).parent
ASSETS = HERE / "assets"
# A symlink to clients/js/src in a checkout (one source, no copy to keep in step); the
# wheel holds the files themselves. A checkout without symlinks reads the source.
CLIENT = HERE / "client"
if not CLIENT.is_dir():
    CLIENT = HERE.parents[1] / "clients" / "js" / "src"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

# Scripts only from this origin, and no inline script or style at all: everything the
# pages show is set as text, and this policy makes a slip fail closed. `img-src data:`
# lets an image part carried as base64 show; no other origin is ever contacted.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    # Always revalidated (the ETag makes that a 304): there is no build step that
    # would give a new version of a file a new name.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str

    def response(self, if_none_match: str | None) -> Response:
        headers = {**HEADERS, "ETag": self.etag}
        if if_none_match is not None and self.etag in (
            tag.strip().removeprefix("W/") for tag in if_none_match.split(",")
        ):
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type=self.content_type, headers=headers)


def load(directory: Path, prefix: str = "") -> dict[str, StaticFile]:
    """The servable files of `directory` (by the suffixes above), read once: a fixed
    set, so no request path is ever joined to the file system."""
    files = {}
    for path in sorted(directory.iterdir()):
        content_type = CONTENT_TYPES.get(path.suffix)
        if content_type is None or not path.is_file():
            continue
        body = path.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        files[prefix + path.name] = StaticFile(body, content_type, etag)
    return files


IfNoneMatch = Annotated[str | None, Header(include_in_schema=False)]


def create_router() -> APIRouter:
    files = {**load(ASSETS), **load(CLIENT, "client/")}
    sessions_page = files.pop("sessions.html")
    chat_page = files.pop("chat.html")
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def front_door(request: Request) -> Response:
        # A person who opens the server's address gets the web view, not a 404.
        return RedirectResponse(request.scope.get("root_path", "") + "/sessions", 307)

    @router.get("/sessions")
    async def sessions_view(if_none_match: IfNoneMatch = None) -> Response:
        return sessions_page.response(if_none_match)

    @router.get("/sessions/{session_id}/chat")
    async def chat_view(session_id: str, if_none_match: IfNoneMatch = None) -> Response:
        # A malformed id is the API's 400; whether the session exists (and is the
        # caller's) the page learns from the API, with the caller's key.
        parse_or_400("session", "session", session_id)
        return chat_page.response(if_none_match)

    @router.get("/web/{name:path}")
    async def web_file(name: str, if_none_match: IfNoneMatch = None) -> Response:
        file = files.get(name)
        if file is None:
            raise NotFound(f"No file {name!r} in the web view")
        return file.response(if_none_match)

    return router
