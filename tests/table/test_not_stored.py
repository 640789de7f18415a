"""Answers say ``Cache-Control: no-store`` (shared/infra/web.py ``not_stored``): a seat's
view holds its hand, which a browser's cache on a shared phone would otherwise keep."""

from __future__ import annotations

from tests.table.conftest import Api, ws_receive


async def test_a_seats_view_and_every_other_answer_are_not_stored(api: Api) -> None:
    table_id, ana, _ = await api.table_for_two()
    for path, token, status in [
        (f"/v1/tables/{table_id}", ana, 200),  # Ana's hand is in it
        (f"/v1/tables/{table_id}", None, 200),  # a spectator's
        (f"/v1/tables/{table_id}/events?after=0", None, 200),
        ("/v1/players/me/tables", ana, 200),
        ("/v1/tables/nope", ana, 404),  # a refusal
        (f"/v1/tables/{table_id}/events?after=-1", None, 400),
        ("/healthz", None, 200),
    ]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with api.client.get(path, headers=headers) as r:
            assert r.status == status, (path, r.status, await r.text())
            assert r.headers.get("Cache-Control") == "no-store", (path, dict(r.headers))
    async with api.client.post(
        f"/v1/tables/{table_id}/commands",
        json={"type": "pass_upcard", "command_id": "c-1"},
        headers={"Authorization": f"Bearer {ana}"},
    ) as r:
        assert r.status in (200, 409), await r.text()  # a move's answer, or not her turn
        assert r.headers.get("Cache-Control") == "no-store"


async def test_a_socket_is_still_served(api: Api) -> None:
    table_id, ana, _ = await api.table_for_two()
    async with api.client.ws_connect(f"/v1/tables/{table_id}/ws?token={ana}") as ws:
        assert (await ws_receive(ws))["kind"] == "snapshot"
