"""The model catalog: `GET /v1/models`, `model_id` and `controls.model_id` checked
against it (422 naming the field, nothing stored), `MODELS_FILE`, and the one-line
start-up refusal of a bad one."""

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.catalog.registry import ConfigError, derived_id, load_catalog, provider_id
from app.settings import Settings
from tests.support.api import text_body, text_of
from tests.support.cli import run_cli
from tests.support.database import table_rows
from tests.support.fake_openai import FakeOpenAI
from tests.support.in_process import running_app
from tests.support.lanes import make_settings
from tests.support.problems import assert_problem
from tests.support.servers import Server, free_port, start_server

SCRIPTED = derived_id("scripted", "scripted")
OTHER = "model_" + "a" * 32
LARGE = "model_" + "b" * 32


def models_file(tmp_path: Path, models: Any) -> str:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(models))
    return str(path)


async def test_the_default_catalog_is_the_drivers_one_model(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/v1/models")
    assert response.status_code == 200, response.text
    listed = response.json()
    (model,) = listed["data"]
    assert listed["total"] == 1
    loaded_at = model["created_at"]
    assert model == {
        "id": SCRIPTED,
        "name": "scripted",
        "driver": "scripted",
        "context_tokens": 128_000,
        # Upstream's ModelWithProvider around them, for the official SDK.
        "display_name": "scripted",
        "model_id": "scripted",
        "provider_id": provider_id("scripted"),
        "provider_name": "scripted",
        "provider_type": "scripted",
        "capabilities": [],
        "enabled": True,
        "healthy": True,
        "is_favorite": False,
        "source": "predefined",
        "created_at": loaded_at,
        "updated_at": loaded_at,
    }
    assert loaded_at.endswith("Z")
    # The ID is derived, not random: every process and restart lists the same one.
    assert derived_id("scripted", "scripted") == SCRIPTED
    one = await client.get(f"/v1/models/{SCRIPTED}")
    assert one.status_code == 200, one.text
    assert one.json() == model
    missing = await client.get(f"/v1/models/{LARGE}")
    assert_problem(missing, 404, code="model_not_found")


async def test_a_session_and_a_message_select_listed_models_only(
    client: httpx.AsyncClient, running: Any
) -> None:
    created = await client.post("/v1/sessions", json={"model_id": SCRIPTED})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    database = running.app.state.app.database
    before = await table_rows(database)
    refused = await client.post("/v1/sessions", json={"model_id": OTHER})
    body = assert_problem(refused, 422, code="validation_error")
    assert body["detail"].startswith(f"model_id: unknown model '{OTHER}'")
    message = {**text_body("hi"), "controls": {"model_id": OTHER}}
    refused = await client.post(f"/v1/sessions/{sid}/messages", json=message)
    body = assert_problem(refused, 422, code="validation_error")
    assert body["detail"].startswith("controls.model_id: unknown model")
    assert await table_rows(database) == before
    message = {**text_body("hi"), "controls": {"model_id": SCRIPTED}}
    accepted = await client.post(f"/v1/sessions/{sid}/messages", json=message)
    assert accepted.status_code == 201, accepted.text


async def test_a_models_file_lists_the_operators_models(
    database_url: str, tmp_path: Path
) -> None:
    path = models_file(
        tmp_path,
        {
            "models": [
                {"id": OTHER, "name": "small", "driver": "scripted"},
                {
                    "id": LARGE,
                    "name": "large",
                    "driver": "scripted",
                    "provider_model": "large-2026",
                    "context_tokens": 1_000_000,
                },
                {"name": "derived", "driver": "scripted"},
            ]
        },
    )
    settings = make_settings(database_url, models_file=path)
    async with running_app(settings) as running:
        listed = (await running.client.get("/v1/models")).json()
        assert [m["id"] for m in listed["data"]] == [
            OTHER,
            LARGE,
            derived_id("scripted", "derived"),
        ]
        large = listed["data"][1]
        assert (large["id"], large["name"], large["driver"]) == (
            LARGE,
            "large",
            "scripted",
        )
        assert (large["context_tokens"], large["source"]) == (1_000_000, "manual")
        assert large["model_id"] == "large-2026"
        assert listed["data"][0]["context_tokens"] == settings.model_context_tokens
        created = await running.client.post("/v1/sessions", json={"model_id": LARGE})
        assert created.status_code == 201, created.text
        # The default catalog's model is not in this one.
        refused = await running.client.post("/v1/sessions", json={"model_id": SCRIPTED})
        assert_problem(refused, 422, code="validation_error")


BAD_FILES = [
    ({"models": []}, "with at least one"),
    ([{"name": "x"}], "with at least one"),
    ({"models": [{"name": ""}]}, "models[0].name"),
    ({"models": [{"name": "x", "driver": "gpt"}]}, "models[0].driver"),
    ({"models": [{"name": "x", "id": "model_12"}]}, "models[0].id"),
    ({"models": [{"name": "x", "context_tokens": 10}]}, "models[0].context_tokens"),
    ({"models": [{"name": "x", "context_tokens": True}]}, "models[0].context_tokens"),
    ({"models": [{"name": "x", "colour": "red"}]}, "unknown field 'colour'"),
    ({"models": [{"name": "x"}, {"name": "x"}]}, "listed twice"),
    ({"models": [{"name": "x", "id": f"{LARGE}\n"}]}, "models[0].id"),
    ({"models": [{"name": "a\u0000b"}]}, "models[0].name"),
    ({"models": [{"name": "gpt\u202e4"}]}, "models[0].name"),
    ({"models": [{"name": "x", "provider_model": "m\n"}]}, "provider_model"),
    ({"models": [{"name": f"m{i}"} for i in range(1_001)]}, "more than 1,000 models"),
]


@pytest.mark.parametrize(("document", "named"), BAD_FILES)
def test_a_bad_models_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, document: Any, named: str
) -> None:
    settings = Settings(models_file=models_file(tmp_path, document))
    with pytest.raises(ConfigError) as refused:
        load_catalog(settings)
    assert named in str(refused.value)
    assert str(refused.value).startswith("MODELS_FILE (")


def test_a_models_file_that_is_not_a_regular_file_is_refused_at_once(
    tmp_path: Path,
) -> None:
    """A FIFO would block start-up until something wrote to it."""
    fifo = tmp_path / "models.fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_catalog(Settings(models_file=str(fifo)))
    with pytest.raises(ConfigError, match="not a regular file"):
        load_catalog(Settings(models_file=str(tmp_path)))


async def test_the_server_refuses_to_start_with_a_bad_models_file_in_one_line(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELS_FILE", str(tmp_path / "missing.json"))
    result = await run_cli(database_url, "serve")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith("invalid configuration: MODELS_FILE (")
    assert "cannot be read" in result.stderr
    assert "Traceback" not in result.stderr


@contextmanager
def openai_entry_server(
    database_url: str, tmp_path: Path
) -> Iterator[tuple[Server, FakeOpenAI]]:
    """A server on MODEL_DRIVER=scripted whose catalog also lists an `openai` entry
    (LARGE, `fake-large-2026`) answered by the OpenAI test server."""
    fake = FakeOpenAI(free_port()).start()
    path = models_file(
        tmp_path,
        {
            "models": [
                {"id": OTHER, "name": "offline", "driver": "scripted"},
                {
                    "id": LARGE,
                    "name": "large",
                    "driver": "openai",
                    "provider_model": "fake-large-2026",
                },
            ]
        },
    )
    server = start_server(
        database_url,
        tmp_path,
        MODEL_DRIVER="scripted",
        OPENAI_BASE_URL=fake.base_url,
        MODELS_FILE=path,
    )
    try:
        yield server, fake
    finally:
        server.stop()
        fake.stop()


async def test_a_catalog_entry_runs_on_its_own_driver(
    database_url: str, tmp_path: Path
) -> None:
    """MODEL_DRIVER=scripted with an `openai` entry in the catalog: a message that
    selects the entry is answered by that provider, under the entry's provider model
    name; the others stay with the scripted model."""
    with openai_entry_server(database_url, tmp_path) as (server, fake):
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as api:
            created = await api.post("/v1/sessions", json={})
            sid = created.json()["id"]
            url = f"/v1/sessions/{sid}/messages"
            chosen = {**text_body("hi there"), "controls": {"model_id": LARGE}}
            answered = await api.post(url, params={"wait": "true"}, json=chosen)
            assert answered.status_code == 200, answered.text
            [reply] = answered.json()["messages"]
            assert text_of(reply) == "Hello from the fake model."
            assert [r.body["model"] for r in fake.for_text("hi there")] == [
                "fake-large-2026"
            ]
            events = (await api.get(f"/v1/sessions/{sid}/events")).json()["data"]
            opened = [e for e in events if e["type"] == "output.message.started"]
            assert opened[0]["data"]["model"] == "fake-large-2026"
            # Without controls, the session's default (the first entry): scripted.
            echoed = await api.post(
                url, params={"wait": "true"}, json=text_body("echo me")
            )
            assert text_of(echoed.json()["messages"][-1]) == "echo me"
            assert fake.for_text("echo me") == []


def test_an_openai_entry_needs_the_providers_address(tmp_path: Path) -> None:
    document = {"models": [{"name": "large", "driver": "openai"}]}
    with pytest.raises(ConfigError) as refused:
        load_catalog(Settings(models_file=models_file(tmp_path, document)))
    assert "models[0].driver: openai needs OPENAI_BASE_URL" in str(refused.value)
