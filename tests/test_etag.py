"""Polling clients get 304 from the messages list until the session changes."""

import httpx

from tests.support.waits import wait_idle


async def test_list_messages_if_none_match_returns_304_until_a_checkpoint(
    client: httpx.AsyncClient,
) -> None:
    sid = (await client.post("/v1/sessions", json={})).json()["id"]
    body = {"message": {"content": [{"type": "text", "text": "one two"}]}}
    await client.post(f"/v1/sessions/{sid}/messages", json=body)
    await wait_idle(client, sid, within=5)

    first = await client.get(f"/v1/sessions/{sid}/messages")
    etag = first.headers["etag"]
    again = await client.get(
        f"/v1/sessions/{sid}/messages", headers={"If-None-Match": etag}
    )
    assert again.status_code == 304
    assert again.content == b""
    other_page = await client.get(
        f"/v1/sessions/{sid}/messages?limit=1", headers={"If-None-Match": etag}
    )
    assert other_page.status_code == 200

    await client.post(f"/v1/sessions/{sid}/messages", json=body)
    await wait_idle(client, sid, within=5)
    changed = await client.get(
        f"/v1/sessions/{sid}/messages", headers={"If-None-Match": etag}
    )
    assert changed.status_code == 200
    assert changed.headers["etag"] != etag
    assert len(changed.json()["data"]) == 4
