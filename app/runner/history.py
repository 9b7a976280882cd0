"""What a step starts from: the recent conversation, composed for the model the step
runs (the newest user message's choice, else the session's, else the default), fitted
to its context and summarized when it does not fit."""

import contextlib
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

from sqlalchemy.exc import IntegrityError

from app import wire
from app.catalog.registry import Catalog, Model
from app.db.admission import Units
from app.db.reads import Reads
from app.runner import builtin_tools, composer, queries
from app.runner.drivers import create_driver
from app.runner.drivers.base import Driver
from app.settings import Settings

log = logging.getLogger("app.runner")

HISTORY_FOR_MODEL = 50


class Snapshots(Sequence[dict[str, Any]]):
    """The recent messages in their wire form, each parsed when first looked at: a
    step mostly looks at its newest user message only (the model it chose, the
    scripted model's text), of up to HISTORY_FOR_MODEL."""

    __slots__ = ("_parsed", "_stored")

    def __init__(self, stored: list[str | bytes]) -> None:
        self._stored = stored
        self._parsed: list[dict[str, Any] | None] = [None] * len(stored)

    def __len__(self) -> int:
        return len(self._stored)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        parsed = self._parsed[index]
        if parsed is None:
            parsed = self._parsed[index] = wire.loads(self._stored[index])
        return parsed


@dataclass(frozen=True, slots=True)
class Context:
    """What a step starts from (see `History.context`)."""

    messages: Sequence[dict[str, Any]]
    model_input: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    consumed: int
    cancelled: bool
    # The driver of the model the step runs, and the provider's name for that model
    # (None: the driver's own).
    driver: Driver
    model: str | None = None
    # The session's token usage so far, as stored.
    usage: dict[str, Any] | None = None


class History:
    def __init__(
        self,
        *,
        settings: Settings,
        database: Units,
        reads: Reads,
        catalog: Catalog | None,
    ) -> None:
        self.settings = settings
        self.database = database
        self.reads = reads
        # The models sessions and messages select (their name for the provider, their
        # context size); None: the driver's own model and MODEL_CONTEXT_TOKENS.
        self.catalog = catalog
        # One driver of each kind the catalog names; MODEL_DRIVER's is the default.
        self.driver = create_driver(settings)
        self.drivers: dict[str, Driver] = {self.driver.name: self.driver}
        for entry in catalog.models if catalog is not None else ():
            if entry.driver not in self.drivers:
                self.drivers[entry.driver] = create_driver(settings, entry.driver)
        # The recent messages of each session whose turns run here, kept from step to
        # step and turn to turn while this process holds its lease (see `forget`).
        self.windows: dict[uuid.UUID, queries.Window] = {}

    def forget(self, session_id: uuid.UUID) -> None:
        """The session's runner let it go: its window is dropped."""
        self.windows.pop(session_id, None)

    async def context(
        self, session_id: uuid.UUID, session: queries.SessionPart | None = None
    ) -> Context:
        """The recent conversation for the model (wire messages, and composed for it),
        the newest user message sequence it includes, and whether a cancel was
        requested (read first: a cancel that commits after it is seen at the step's
        checkpoint; `session`, when the caller has just read it). Read through the
        session's window: what changed since its previous step."""
        window = self.windows.get(session_id)
        if window is None:
            window = self.windows[session_id] = queries.Window()
        recent = await queries.recent_messages(
            self.reads, session_id, HISTORY_FOR_MODEL, session, window
        )
        attributes, rows = recent.session.attributes, recent.messages
        consumed = max((row.sequence for row in rows if row.role == "user"), default=0)
        history = [
            composer.HistoryMessage(
                row.sequence, row.role, row.visibility, list(row.content)
            )
            for row in rows
        ]
        messages = Snapshots([row.snapshot for row in rows])
        model = self.model(attributes, messages)
        driver = self.drivers[model.driver] if model is not None else self.driver
        tools = list(attributes.get("tools") or ())
        if builtin_tools.offered(self.settings.demo_tools, driver.name):
            # A session tool of a built-in's name is its declaration (a policy for it,
            # or the caller's own tool): the model is offered one function of a name.
            declared = {tool.get("name") for tool in tools}
            builtins = builtin_tools.BUILTIN_TOOLS
            tools = [*(t for t in builtins if t["name"] not in declared), *tools]
        context_tokens = (
            model.context_tokens
            if model is not None
            else self.settings.model_context_tokens
        )

        def fitted(summary: composer.Summary | None = None) -> composer.Composition:
            return composer.fit(
                history,
                system_prompt=attributes.get("system_prompt"),
                provider=driver.name,
                context_tokens=context_tokens,
                summary=summary,
            )

        composition = fitted()
        if composition.omitted_through is not None:
            summary = await self.summary(
                session_id, driver, history, composition.omitted_through, context_tokens
            )
            if summary is not None:
                composition = fitted(summary)
        return Context(
            messages,
            composition.messages,
            tools,
            consumed,
            recent.session.cancel_requested,
            driver,
            model.provider_model if model is not None else None,
            attributes.get("usage"),
        )

    def model(
        self, attributes: dict[str, Any], messages: Sequence[dict[str, Any]]
    ) -> Model | None:
        """The catalog model of the next step: the newest user message's
        `controls.model_id`, else the session's `model_id`, else the default."""
        if self.catalog is None:
            return None
        chosen = attributes.get("model_id")
        for message in reversed(messages):
            if message["role"] == "user":
                chosen = (message.get("controls") or {}).get("model_id") or chosen
                break
        return self.catalog.get(chosen)

    async def summary(
        self,
        session_id: uuid.UUID,
        driver: Driver,
        history: list[composer.HistoryMessage],
        through: int,
        context_tokens: int,
    ) -> composer.Summary | None:
        """A summary of the session's messages up to at least `through`: the newest
        stored one if it reaches that far; otherwise the model writes one (extending
        the newest stored, which it then replaces as the one in use) and it is stored
        as derived data. None if the model could not: history is then truncated."""
        newest = max((m.sequence for m in history), default=0)
        stored = await queries.newest_summary(self.database, session_id, newest)
        previous = (
            composer.Summary(stored.last_sequence, stored.text)
            if stored is not None
            else None
        )
        if previous is not None and previous.last_sequence >= through:
            return previous
        request = composer.summary_request(
            history,
            provider=driver.name,
            context_tokens=context_tokens,
            previous=previous,
            through=through,
        )
        try:
            text = await driver.summarize(request)
        except Exception as exc:
            log.warning("history summary failed, history truncated instead: %s", exc)
            return None
        if not text:
            return None
        first = (
            stored.first_sequence
            if stored is not None
            else min(m.sequence for m in history)
        )
        with contextlib.suppress(IntegrityError):
            await queries.store_summary(self.database, session_id, first, through, text)
        log.info("history up to sequence %d summarized", through)
        return composer.Summary(through, text)
