import httpx


async def test_create_session_and_post_message_runs_a_turn(
    client: httpx.AsyncClient,
) -> None:
    created = await client.post("/v1/sessions", json={"title": "smoke"})
    assert created.status_code == 201
    sid = created.json()["id"]
    posted = await client.post(
        f"/v1/sessions/{sid}/messages",
        json={"message": {"content": [{"type": "text", "text": "hi"}]}},
    )
    assert posted.status_code == 201
    assert posted.json()["delivery"] == "started"


async def test_health_reports_liveness_and_the_bus(client: httpx.AsyncClient) -> None:
    response = await client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "bus": "connected"}
