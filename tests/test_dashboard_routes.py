"""The dashboard's routes in process: the page and its files, and ``/api/timeline.svg``."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from hostler import EventStore
from hostler.clock import SYSTEM_CLOCK
from hostler.events.ledger import LedgerReserved
from hostler.serve.app import make_app
from hostler.serve.dashboard import (
    ASSETS,
    DEFAULT_MINUTES,
    MAX_MINUTES,
    TIMELINE_PATH,
    TIMELINE_TYPES,
)

pytestmark = pytest.mark.anyio
TOKEN = "d" * 43


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    with EventStore.open(tmp_path / "events.db", clock=lambda: datetime.now(UTC)) as opened:
        event = LedgerReserved("e:a:0", 2**25, "me", 0, 0, 2**27, 2**27, True)
        opened.append("ledger/host", [event], expected_version=0)
        yield opened


def client(store: EventStore, *, public: bool = False) -> httpx.AsyncClient:
    # the runtime as the routes see it: its log, and no ledger log of another file
    runtime = SimpleNamespace(
        store=store,
        memory=SimpleNamespace(ledger_log=lambda: None),
        on_stopping=lambda _: None,
        clock=SYSTEM_CLOCK,
    )
    app = make_app(runtime, {}, token=TOKEN, public=public)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


def test_constants_and_the_files_ship_in_the_package() -> None:
    assert TIMELINE_PATH == "/api/timeline.svg"
    assert (DEFAULT_MINUTES, MAX_MINUTES) == (30, 10_080)
    assert set(ASSETS) == {"/", "/dashboard.js", "/dashboard.css"}
    for name, _media in ASSETS.values():
        assert files("hostler.serve").joinpath("static", name).read_bytes()
    assert "ledger.reserved" in TIMELINE_TYPES and "engine.crashed" in TIMELINE_TYPES


async def test_the_page_loads_nothing_from_elsewhere(store: EventStore) -> None:
    async with client(store) as http:
        page = await http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "connect-src 'self'" in policy
        assert "http" not in page.text.replace('charset="utf-8"', "")  # no outside URL
        script = await http.get("/dashboard.js")
        assert script.headers["content-type"].startswith("text/javascript")
        assert "http://" not in script.text and "https://" not in script.text
        assert "Authorization" in script.text and "#" in script.text
        style = await http.get("/dashboard.css")
        assert style.headers["content-type"].startswith("text/css")


async def test_the_timeline_route(store: EventStore) -> None:
    async with client(store) as http:
        answer = await http.get(TIMELINE_PATH, params={"minutes": "5"})
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"] == "image/svg+xml"
        assert "script-src" not in answer.headers["content-security-policy"]
        ids = {e.get("id") for e in ET.fromstring(answer.content).iter()}  # noqa: S314
        assert "engine-e:a:0" in ids and "budget" in ids
        # the log began a moment ago: its window is the narrowest, not the 5 minutes (PM37)
        assert "hostler memory timeline — last 10 s" in answer.text
        assert (await http.get(TIMELINE_PATH)).status_code == 200  # 30 minutes by default
        for bad in ("0", str(MAX_MINUTES + 1), "x", "-5", "1.5", ""):
            refused = await http.get(TIMELINE_PATH, params={"minutes": bad})
            assert refused.status_code == 400, bad
            assert refused.json()["error"]["code"] == "invalid-request"
        assert (await http.get(TIMELINE_PATH, params={"minutes": MAX_MINUTES})).status_code == 200


async def test_a_public_daemon_serves_the_page_but_guards_the_picture(store: EventStore) -> None:
    async with client(store, public=True) as http:
        assert (await http.get("/")).status_code == 200
        assert (await http.get(TIMELINE_PATH)).status_code == 401
        auth = {"authorization": f"Bearer {TOKEN}"}
        assert (await http.get(TIMELINE_PATH, headers=auth)).status_code == 200
