"""``hostler.open_daemon``: the whole daemon inside the caller's task group."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import hostler
from hostler import EventStore
from hostler.errors import StoreLockedError
from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import token_holders

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def write_config(tmp_path: Path) -> Path:
    write_tiny_llama(tmp_path / "alpha.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        f'[daemon]\nidle_timeout = 0\nledger = "ledger.db"\ndata_dir = "{tmp_path / "data"}"\n'
        '\n[[engines]]\nkey = "llamacpp:alpha:0"\nmodel = "alpha.gguf"\nctx = 512\n'
    )
    return config


async def test_open_daemon_serves_and_leaves_no_engine_behind(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    async with hostler.open_daemon(config, listen=("127.0.0.1", 0)) as daemon:
        assert daemon.runtime is not None and daemon.http is not None
        prefix = (tmp_path / "data" / "daemon-id").read_text().strip()
        base = f"http://127.0.0.1:{daemon.http.port}"
        body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.post(f"{base}/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        assert len(token_holders(prefix)) == 1
        # a second daemon on the same data directory is refused, and starts nothing
        with pytest.raises(StoreLockedError):
            async with hostler.open_daemon(config):
                pass
    assert token_holders(prefix) == []
    with EventStore.open(tmp_path / "data" / "events.db") as store:
        stops = [r.payload for r in store.read_all() if r.type == "engine.stop_requested"]
    assert [(s["reason"], s["decision"]) for s in stops] == [("shutdown", {"cause": "closed"})]
