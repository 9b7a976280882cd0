"""Model drivers turn a conversation into a stream of model events (`base`): the
scripted default (`scripted`) and OpenAI-compatible Chat Completions (`openai`)."""

from typing import TYPE_CHECKING

from app.runner.drivers.base import Driver
from app.runner.drivers.scripted import ScriptedDriver

if TYPE_CHECKING:
    from app.settings import Settings


def create_driver(settings: "Settings", name: str | None = None) -> Driver:
    """The driver `name` (MODEL_DRIVER's when None), configured from `settings`."""
    name = name or settings.model_driver
    if name == "scripted":
        return ScriptedDriver(settings.scripted_delay_ms)
    if name == "openai":
        # Imported here: the scripted default never loads the openai package.
        from app.runner.drivers.openai import OpenAIDriver

        return OpenAIDriver(settings)
    raise ValueError(f"unknown model driver {name!r}")
