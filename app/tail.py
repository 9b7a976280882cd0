"""`evermirror tail SESSION_ID`: follow a session in the terminal.

It prints the newest page of messages (`GET /v1/sessions/{id}/messages`), then follows
the Mutation stream (`GET .../messages/stream`) from that page's cursor: committed
`message` snapshots, the `part`s and `delta`s of the message that is streaming, and
`reset`. Text is printed as it streams, one line per part, each line naming its role;
with colours when stdout is a terminal (and `NO_COLOR` is unset), plain otherwise.
`--json` prints one Mutation a line instead, `{"event", "id", "data"}` as the stream
sends it (the messages of the first page as `message` Mutations at the page's cursor),
for a program to read.

Every part is printed once: what was printed of each part's text is remembered, so a
snapshot after its deltas, a reconnect that sends a message again or a reloaded page
adds only what is new. When the stream ends (the server cycles connections, restarts
or is briefly away) it reconnects with `Last-Event-ID` (the cursor of the last
snapshot), with a growing pause while the server is unreachable. An answer that
retrying cannot fix (a bad id, a missing or wrong key, a session that is gone) ends it
with status 1; Ctrl-C ends it with status 0.
"""

import os
import re
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import httpx
import orjson

SESSION_ID = re.compile(r"session_[0-9a-f]{32}\Z")
PAGE_LIMIT = 50
# The server comments every SSE_HEARTBEAT_SECONDS (30 by default): a stream silent for
# much longer than that is dead, whatever the socket says.
READ_TIMEOUT_SECONDS = 75.0
BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 10.0
# Statuses that name a mistake retrying cannot fix.
FATAL_STATUSES = {400, 401, 403, 404, 405, 406, 410, 422}
# How much of a tool's arguments or result a line shows.
SUMMARY_CHARS = 200

RESET = "\033[0m"
STYLES = {
    "user": "\033[1;36m",
    "agent": "\033[1;32m",
    "thinking": "\033[2m",
    "tool": "\033[33m",
    "error": "\033[31m",
    "note": "\033[2m",
}


class Fatal(Exception):
    """An answer that retrying cannot fix."""


class Retry(Exception):
    """An answer to retry after a pause (seconds, from Retry-After, else the backoff)."""

    def __init__(self, text: str, after: float | None = None) -> None:
        super().__init__(text)
        self.after = after


@dataclass(slots=True)
class Frame:
    event: str
    id: str | None
    data: str


def sse_frames(lines: Iterable[str]) -> Iterator[Frame]:
    """Server-Sent Events frames of a stream's lines (comments skipped)."""
    event = ""
    frame_id: str | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data or event:
                yield Frame(event or "message", frame_id, "\n".join(data))
            event, frame_id, data = "", None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            frame_id = value


def _clip(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 3] + "..."


def part_text(part: dict[str, Any]) -> str:
    """The text of a text or reasoning part: live reasoning is a string, a committed
    one `{"kind", "text"}`."""
    text = part.get("text")
    if isinstance(text, dict):
        text = text.get("text")
    return text if isinstance(text, str) else ""


def summary(part: dict[str, Any]) -> tuple[str, str]:
    """(style, one line) for a part that is not streamed text."""
    kind = part.get("type")
    if kind == "tool_call":
        status = part.get("status") or "ready"
        arguments = _clip(part.get("arguments"))
        return "tool", f"[tool {part.get('name')} {arguments}: {status}]"
    if kind == "tool_result":
        if part.get("error"):
            return "error", f"[tool result: error {_clip(part['error'])}]"
        return "tool", f"[tool result: {_clip(part.get('result'))}]"
    if kind == "error":
        return "error", f"[error {part.get('code')}: {part.get('message')}]"
    if kind == "context":
        return "note", f"[context {part.get('tag')}: {_clip(part.get('context'))}]"
    if kind == "interaction":
        prompt = f" {_clip(part['prompt'])}" if part.get("prompt") else ""
        return "tool", f"[{part.get('kind')} {part.get('status')}{prompt}]"
    if kind == "action":
        return "note", f"[{part.get('title') or part.get('action_type') or 'action'}]"
    name = part.get("filename") or part.get("url") or part.get("file_id") or ""
    return "note", f"[{kind}{' ' + str(name) if name else ''}]"


class Screen:
    """Human output: one line per part, text appended as it streams."""

    def __init__(self, out: TextIO, colour: bool) -> None:
        self.out = out
        self.colour = colour
        # (message id, part id) -> characters of its text printed so far, and whether
        # it is text or reasoning.
        self.printed: dict[tuple[str, str], int] = {}
        self.kinds: dict[tuple[str, str], str] = {}
        # (message id, part id) -> the line last printed for a part that is not text.
        self.shown: dict[tuple[str, str], str] = {}
        # The part whose text the last, unfinished line shows.
        self.open: tuple[str, str] | None = None

    def _style(self, style: str, text: str) -> str:
        return f"{STYLES[style]}{text}{RESET}" if self.colour and text else text

    def _label(self, role: str, kind: str) -> str:
        label = f"{role}:" if kind != "reasoning" else f"{role} (thinking):"
        return self._style(role if role in STYLES else "note", label) + " "

    def _end_line(self) -> None:
        if self.open is not None:
            self.out.write("\n")
            self.open = None

    def message(self, message: dict[str, Any]) -> None:
        """A committed snapshot: whatever of it was not printed yet."""
        message_id = str(message.get("id"))
        role = str(message.get("role"))
        for part in message.get("content") or ():
            self.part(message_id, role, part)
        if message.get("state") == "done" and self.open and self.open[0] == message_id:
            self._end_line()

    def part(self, message_id: str, role: str, part: dict[str, Any]) -> None:
        key = (message_id, str(part.get("part_id") or part.get("sequence")))
        kind = part.get("type")
        if kind in ("text", "reasoning"):
            self.kinds[key] = str(kind)
            self.text(key, role, 0, part_text(part))
            return
        style, line = summary(part)
        if self.shown.get(key) != line:
            self.shown[key] = line
            self._end_line()
            self.out.write(self._label(role, "") + self._style(style, line) + "\n")

    def text(self, key: tuple[str, str], role: str, offset: int, text: str) -> None:
        """Text at `offset` of a part: only what goes past what was printed, and
        nothing if it would leave a gap (the committed snapshot brings it whole)."""
        done = self.printed.setdefault(key, 0)
        end = offset + len(text)
        if offset > done or end <= done:
            return
        self.printed[key] = end
        reasoning = self.kinds.get(key) == "reasoning"
        if self.open != key:
            self._end_line()
            self.out.write(self._label(role, "reasoning" if reasoning else "text"))
            self.open = key
        chunk = text[done - offset :]
        self.out.write(self._style("thinking", chunk) if reasoning else chunk)

    def delta(self, data: dict[str, Any]) -> None:
        key = (str(data.get("message_id")), str(data.get("part_id")))
        if key not in self.kinds:
            # Its `part` frame was missed: the committed snapshot will bring it.
            return
        self.text(key, "agent", int(data.get("offset", 0)), str(data.get("text", "")))

    def frame(self, frame: Frame, data: dict[str, Any]) -> None:
        if frame.event == "message":
            self.message(data["message"])
        elif frame.event == "part":
            self.part(str(data["message_id"]), "agent", data["part"])
        elif frame.event == "delta":
            self.delta(data)

    def finish(self) -> None:
        self._end_line()
        self.out.flush()

    def flush(self) -> None:
        self.out.flush()


class JsonLines:
    """`--json`: one Mutation a line."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def message(self, message: dict[str, Any], cursor: str) -> None:
        self.write("message", cursor, {"message": message})

    def write(self, event: str, frame_id: str | None, data: Any) -> None:
        line = {"event": event, "id": frame_id, "data": data}
        self.out.write(orjson.dumps(line).decode() + "\n")

    def flush(self) -> None:
        self.out.flush()

    def finish(self) -> None:
        self.out.flush()


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdigit() else None


def _check(response: httpx.Response) -> None:
    if response.status_code == 200:
        return
    response.read()
    try:
        body = response.json()
        detail = body.get("detail") or body.get("title") or ""
    except ValueError:
        detail = response.text[:200]
    text = f"{response.status_code} {detail}".strip()
    if response.status_code in FATAL_STATUSES:
        raise Fatal(text)
    raise Retry(text, _retry_after(response))


class Tail:
    def __init__(
        self,
        client: httpx.Client,
        session_id: str,
        output: Screen | JsonLines,
        err: TextIO,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self.output = output
        self.err = err
        self.cursor: str | None = None
        # Whether the server is away (an outage was announced), and the pause before
        # the next attempt.
        self.away = False
        self.backoff = BACKOFF_FIRST_SECONDS

    def note(self, text: str) -> None:
        self.output.flush()
        self.err.write(f"evermirror tail: {text}\n")
        self.err.flush()

    def load_page(self) -> None:
        """The newest page of messages; the stream goes on from its cursor."""
        response = self.client.get(
            f"/v1/sessions/{self.session_id}/messages",
            params={"limit": PAGE_LIMIT},
        )
        _check(response)
        page = response.json()
        cursor = str(page["cursor"])
        for message in sorted(page["data"], key=lambda m: int(m["sequence"])):
            if isinstance(self.output, JsonLines):
                self.output.message(message, cursor)
            else:
                self.output.message(message)
        self.output.flush()
        self.cursor = cursor

    def stream(self) -> None:
        """Follow the Mutation stream until it ends."""
        headers = {"Accept": "text/event-stream"}
        if self.cursor is not None:
            headers["Last-Event-ID"] = self.cursor
        with self.client.stream(
            "GET",
            f"/v1/sessions/{self.session_id}/messages/stream",
            headers=headers,
        ) as response:
            _check(response)
            if self.away:
                self.note("reconnected")
                self.away = False
            self.backoff = BACKOFF_FIRST_SECONDS
            for frame in sse_frames(response.iter_lines()):
                data = orjson.loads(frame.data) if frame.data else {}
                if isinstance(self.output, JsonLines):
                    self.output.write(frame.event, frame.id, data)
                else:
                    self.output.frame(frame, data)
                self.output.flush()
                if frame.event == "message" and frame.id:
                    self.cursor = frame.id
                elif frame.event == "reset":
                    # The server cannot go on from our cursor: reload the snapshot
                    # (only what was not printed yet is printed).
                    self.note(f"stream reset ({data.get('reason')}); reloading")
                    self.load_page()

    def run(self) -> int:
        while True:
            try:
                if self.cursor is None:
                    self.load_page()
                self.stream()
                # The stream ended as streams do (the server cycles connections):
                # reconnect at once, from the cursor.
                time.sleep(0.1)
            except Fatal as exc:
                self.note(str(exc))
                return 1
            except (Retry, httpx.TransportError) as exc:
                after = exc.after if isinstance(exc, Retry) else None
                if not self.away:
                    self.note(f"{_reason(exc)}; reconnecting")
                    self.away = True
                time.sleep(after if after is not None else self.backoff)
                self.backoff = min(self.backoff * 2, BACKOFF_MAX_SECONDS)


def _reason(exc: Exception) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "the server is unreachable"
    if isinstance(exc, httpx.ReadTimeout):
        return "the stream went silent"
    if isinstance(exc, httpx.TransportError):
        return "the connection was lost"
    return f"the server answered {exc}"


def main(url: str, session_id: str, key: str | None, as_json: bool) -> int:
    if not SESSION_ID.match(session_id):
        sys.stderr.write(
            f"evermirror tail: {session_id!r} is not a session id (session_<32 hex>)\n"
        )
        return 2
    out = sys.stdout
    output: Screen | JsonLines = (
        JsonLines(out)
        if as_json
        else Screen(out, colour=out.isatty() and not os.environ.get("NO_COLOR"))
    )
    # Ctrl-C stops it even where SIGINT was ignored by whoever started it (a shell
    # runs background commands so, and Python then installs no handler of its own).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    client = httpx.Client(
        base_url=url.rstrip("/"),
        headers=headers,
        timeout=httpx.Timeout(10.0, read=READ_TIMEOUT_SECONDS),
    )
    tail = Tail(client, session_id, output, sys.stderr)
    try:
        tail.note(f"following {session_id} at {url} (Ctrl-C to stop)")
        code = tail.run()
        output.finish()
        return code
    except KeyboardInterrupt:
        output.finish()
        return 0
    except BrokenPipeError:
        # The reader went away (`| head`): stdout goes nowhere from now on, so that
        # flushing it at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        return 0
    finally:
        client.close()
