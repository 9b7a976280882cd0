"""The service's built-in tools: the demo tool the scripted scenarios call, offered
next to the session's own to the scripted driver's models (to others with DEMO_TOOLS),
and run by the runner itself."""

from typing import Any

from app.runner.drivers.base import ModelError

# The built-in tools, offered to real models as Chat Completions function tools.
BUILTIN_TOOLS: list[dict[str, Any]] = [
    {
        "type": "builtin",
        "name": "lookup",
        "description": "Look a question up in the service's built-in knowledge base.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The question"}},
            "required": ["query"],
        },
    }
]


def offered(demo_tools: bool | None, driver: str) -> bool:
    """Whether a model of `driver` is offered the built-in tools."""
    return driver == "scripted" if demo_tools is None else demo_tools


async def run_tool(name: str, arguments: dict[str, Any]) -> Any:
    """The built-in tools the scripted scenarios call."""
    if name == "lookup":
        return {"query": arguments.get("query"), "answer": 42}
    raise ModelError(f"unknown tool {name}")
