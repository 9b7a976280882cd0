"""The model catalog: the models a session (`model_id`) or a message
(`controls.model_id`) may select, each mapped to a driver, the provider's name for the
model and its context size.

Without `MODELS_FILE` the catalog holds one model, the configured driver's, under an
ID derived from the driver and the provider's model name: the same in every process
and across restarts, so stored sessions keep pointing at it. `MODELS_FILE` names a JSON
file `{"models": [{id, name, driver, provider_model?, context_tokens?}, ...]}`; the first
model is the default."""

import json
import re
import stat
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app import wire
from app.errors import ModelNotFound, Unprocessable
from app.settings import Settings

MODEL_ID = re.compile(r"model_[0-9a-f]{32}")
DRIVERS = ("scripted", "openai")
# Derived IDs: uuid5 in a namespace of our own, so they never collide with random ones.
NAMESPACE = uuid.UUID("6f0d3c52-3b8e-4f0c-9a51-3c1f6a2d9e17")


class ConfigError(ValueError):
    """A configuration the service cannot start with; the message names the setting."""


@dataclass(frozen=True, slots=True)
class Model:
    id: str
    name: str
    driver: str
    # What the provider calls it (the `model` of a Chat Completions request).
    provider_model: str
    context_tokens: int
    # Upstream's `source`: `predefined` (the driver's one model) or `manual` (an
    # operator's MODELS_FILE entry).
    source: str = "predefined"

    def wire(self, loaded_at: str) -> dict[str, Any]:
        """This service's fields, and upstream's ModelWithProvider around them (the
        official SDK parses that): the driver is the provider, the model is enabled,
        healthy and nobody's favourite, and its times are when this process loaded
        the catalog."""
        return {
            "id": self.id,
            "name": self.name,
            "driver": self.driver,
            "context_tokens": self.context_tokens,
            "display_name": self.name,
            "model_id": self.provider_model,
            "provider_id": provider_id(self.driver),
            "provider_name": self.driver,
            "provider_type": self.driver,
            "capabilities": [],
            "enabled": True,
            "healthy": True,
            "is_favorite": False,
            "source": self.source,
            "created_at": loaded_at,
            "updated_at": loaded_at,
        }


def provider_id(driver: str) -> str:
    return "provider_" + uuid.uuid5(NAMESPACE, f"provider:{driver}").hex


def derived_id(driver: str, provider_model: str) -> str:
    return "model_" + uuid.uuid5(NAMESPACE, f"{driver}:{provider_model}").hex


class Catalog:
    def __init__(self, models: list[Model]) -> None:
        assert models, "a catalog holds at least one model"
        self.models = models
        self.by_id = {m.id: m for m in models}
        self.default = models[0]
        self.loaded_at = wire.timestamp(datetime.now(UTC))

    def listed(self) -> bytes:
        """`GET /v1/models`: every model, the default first."""
        return wire.dumps(
            {
                "data": [m.wire(self.loaded_at) for m in self.models],
                "total": len(self.models),
            }
        )

    def one(self, model_id: str) -> bytes:
        """`GET /v1/models/{id}`; ModelNotFound for an ID the catalog does not hold."""
        model = self.by_id.get(model_id)
        if model is None:
            raise ModelNotFound(f"Model {model_id} not found")
        return wire.dumps(model.wire(self.loaded_at))

    def get(self, model_id: str | None) -> Model:
        """The model an ID selects (the default for None). The ID was checked when it
        was stored; one the catalog no longer holds falls back to the default."""
        if model_id is None:
            return self.default
        return self.by_id.get(model_id, self.default)

    def require(self, model_id: str | None, field: str) -> None:
        """422 naming `field` unless `model_id` is None or one the catalog holds."""
        if model_id is not None and model_id not in self.by_id:
            raise Unprocessable(
                f"{field}: unknown model '{model_id}'; GET /v1/models lists them"
            )


def default_model(settings: Settings) -> Model:
    driver = settings.model_driver
    # The openai driver's one model is the one it is configured to call.
    provider_model = (
        settings.openai_model
        if driver == "openai" and settings.openai_model
        else driver
    )
    return Model(
        id=derived_id(driver, provider_model),
        name=provider_model,
        driver=driver,
        provider_model=provider_model,
        context_tokens=settings.model_context_tokens,
    )


def load_catalog(settings: Settings) -> Catalog:
    if settings.models_file is None:
        return Catalog([default_model(settings)])
    return Catalog(_read_file(Path(settings.models_file), settings))


# A catalog file past these is a mistake, not a catalog (GET /v1/models lists it whole).
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_MODELS = 1_000


def _read_file(path: Path, settings: Settings) -> list[Model]:
    where = f"MODELS_FILE ({path})"
    try:
        found = path.stat()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read: {exc.strerror}") from None
    # A FIFO or a device would block start-up or never end: regular files only.
    if not stat.S_ISREG(found.st_mode):
        raise ConfigError(f"{where}: not a regular file")
    if found.st_size > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_FILE_BYTES:,} bytes")
    try:
        document = json.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"{where}: not JSON: {exc}") from None
    entries = document.get("models") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f'{where}: expected {{"models": [...]}} with at least one')
    if len(entries) > MAX_MODELS:
        raise ConfigError(f"{where}: more than {MAX_MODELS:,} models")
    models: list[Model] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        model = _model(entry, f"{where}: models[{index}]", settings)
        if model.id in seen:
            raise ConfigError(f"{where}: model id {model.id} is listed twice")
        seen.add(model.id)
        models.append(model)
    return models


def _shown(text: str) -> bool:
    """Text fit to show and send: no control characters (NUL, newlines) and no
    invisible formatting (bidi overrides such as U+202E that make a name read as
    another)."""
    return not any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in text)


def _model(entry: Any, where: str, settings: Settings) -> Model:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected an object")
    unknown = set(entry) - {"id", "name", "driver", "provider_model", "context_tokens"}
    if unknown:
        raise ConfigError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    driver = entry.get("driver", settings.model_driver)
    if driver not in DRIVERS:
        raise ConfigError(f"{where}.driver: one of {', '.join(DRIVERS)}")
    if driver == "openai" and not settings.openai_base_url:
        raise ConfigError(f"{where}.driver: openai needs OPENAI_BASE_URL")
    name = entry.get("name")
    if (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > 255
        or not _shown(name)
    ):
        raise ConfigError(
            f"{where}.name: a non-empty string of at most 255 characters, without"
            " control or formatting characters"
        )
    provider_model = entry.get("provider_model", name)
    if (
        not isinstance(provider_model, str)
        or not provider_model.strip()
        or len(provider_model) > 255
        or not _shown(provider_model)
    ):
        raise ConfigError(
            f"{where}.provider_model: a non-empty string of at most 255 characters,"
            " without control or formatting characters"
        )
    model_id = entry.get("id", derived_id(driver, provider_model))
    # fullmatch: `$` would also match before a trailing newline.
    if not isinstance(model_id, str) or not MODEL_ID.fullmatch(model_id):
        raise ConfigError(f"{where}.id: model_ and 32 lowercase hex digits")
    context = entry.get("context_tokens", settings.model_context_tokens)
    if type(context) is not int or not 1_000 <= context <= 10_000_000:
        raise ConfigError(f"{where}.context_tokens: a whole number, 1000..10000000")
    return Model(model_id, name, driver, provider_model, context, source="manual")
