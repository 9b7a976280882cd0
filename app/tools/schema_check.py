"""A session's tool `parameters` checked against the JSON Schema meta-schema (draft
2020-12, which the models' function-calling APIs accept), within a budget.

The meta-schema check costs about half a millisecond per subschema, so it is bounded
three ways: one request's tools may hold at most `MAX_SCHEMA_NODES` JSON containers
and items together (counted first, in one cheap walk), the check runs in one thread of
its own so the event loop keeps serving every other request meanwhile, and a schema
found valid once is remembered (clients send the same tool list again and again).
"""

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from app.errors import Unprocessable
from app.tools.schemas import ToolDefinition

# Objects, arrays and array items across all of one request's tool schemas: about two
# seconds of checking at most, for 128 tools of 30 subschemas each.
MAX_SCHEMA_NODES = 4_000
# How many distinct valid schemas (by digest) are remembered.
KNOWN_SCHEMAS = 4_096

# One thread: concurrent checks queue here, rather than take turns with the event loop
# for the interpreter lock in several threads.
_checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="schema-check")
_known: OrderedDict[bytes, None] = OrderedDict()


def schema_nodes(value: Any, budget: int) -> int:
    """The objects, arrays and array items in `value`; stops counting past `budget`."""
    count = 0
    stack = [value]
    while stack and count <= budget:
        item = stack.pop()
        if isinstance(item, dict):
            count += 1
            stack.extend(item.values())
        elif isinstance(item, list):
            count += 1 + len(item)
            stack.extend(item)
    return count


def _digest(schema: dict[str, Any]) -> bytes:
    encoded = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(encoded, digest_size=16).digest()


def _first_invalid(
    schemas: Sequence[tuple[int, dict[str, Any]]],
) -> tuple[int, str] | None:
    """The index and reason of the first schema that is not a valid JSON Schema."""
    for index, schema in schemas:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            where = "/".join(str(p) for p in exc.path)
            return index, exc.message[:300] + (f" (at {where})" if where else "")
    return None


async def check_tools(tools: Sequence[ToolDefinition] | None) -> None:
    """422 if the tools' schemas together exceed the budget, or one of them is not a
    valid JSON Schema."""
    if not tools:
        return
    total = 0
    unknown: list[tuple[int, bytes, dict[str, Any]]] = []
    for index, tool in enumerate(tools):
        total += schema_nodes(tool.parameters, MAX_SCHEMA_NODES - total)
        if total > MAX_SCHEMA_NODES:
            raise Unprocessable(
                f"tools: their parameters hold more than {MAX_SCHEMA_NODES} JSON "
                "objects, arrays and array items together"
            )
        digest = _digest(tool.parameters)
        if digest in _known:
            _known.move_to_end(digest)
        else:
            unknown.append((index, digest, tool.parameters))
    if not unknown:
        return
    loop = asyncio.get_running_loop()
    invalid = await loop.run_in_executor(
        _checker, _first_invalid, [(index, schema) for index, _, schema in unknown]
    )
    if invalid is not None:
        index, reason = invalid
        raise Unprocessable(
            f"tools.{index}.parameters: not a valid JSON Schema: {reason}"
        )
    for _, digest, _ in unknown:
        _known[digest] = None
    while len(_known) > KNOWN_SCHEMAS:
        _known.popitem(last=False)
