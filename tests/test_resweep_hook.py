"""RD9: when the supervisor asks ``on_exited_before_ready``, and what its answer does.

The fake engine runs as a real process under the real supervisor; a stray sweep and retry with
ds4's real lock are in ``tests/test_ds4_adapter.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hostler.engines.supervisor import Supervisor
from hostler.errors import EngineStartError, PluginError
from hostler.machines.engine import EngineStartRequested
from hostler.store.log import EventStore
from hostler.testing.fake_engine import Behaviour, FakeEngineAdapter
from hostler.testing.harness import Harness

pytestmark = pytest.mark.anyio
KEY = "fake:early:0"


class Asking(FakeEngineAdapter):
    """Records each question and answers ``answer`` (or raises, when it is an exception)."""

    startup_timeout = 1.0

    def __init__(self, behaviour: Behaviour, answer: object) -> None:
        super().__init__(behaviour)
        self.answer = answer
        self.asked: list[str] = []

    def on_exited_before_ready(self, message: str) -> bool:
        self.asked.append(message)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer  # type: ignore[return-value] # a plugin may answer anything


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    opened = EventStore.open(tmp_path / "events.db", owner=True)
    try:
        yield opened
    finally:
        opened.close()


def supervisor(tmp_path: Path, store: EventStore, adapter: Asking) -> Supervisor:
    # this daemon owns no other engine: the sweep may look
    return Harness(tmp_path / "data", store, {"fake": adapter}).supervisor(KEY, owned=list)


def causes(store: EventStore) -> list[str]:
    return [
        r.event.cause
        for r in store.read_stream(f"engine/{KEY}")
        if isinstance(r.event, EngineStartRequested)
    ]


async def test_an_exit_before_ready_asks_once_and_a_sweep_of_nothing_retries_nothing(
    tmp_path: Path, store: EventStore
) -> None:
    adapter = Asking(Behaviour(exit_code=7), answer=True)
    sup = supervisor(tmp_path, store, adapter)
    with pytest.raises(EngineStartError, match=r"exited \(exit code 7\) before becoming ready"):
        await sup.ensure_running()
    assert len(adapter.asked) == 1
    assert adapter.asked[0].startswith(f"{KEY}: exited (exit code 7) before becoming ready")
    assert causes(store) == ["request"]  # no stray of ours was found: no retry


async def test_a_timeout_is_not_asked_about(tmp_path: Path, store: EventStore) -> None:
    adapter = Asking(Behaviour(load_seconds=30, listen_while_loading=True), answer=True)
    sup = supervisor(tmp_path, store, adapter)
    with pytest.raises(EngineStartError, match="did not become ready within 1 s"):
        await sup.ensure_running()
    assert adapter.asked == []


async def test_a_fatal_line_is_asked_about(tmp_path: Path, store: EventStore) -> None:
    adapter = Asking(Behaviour(fatal_line="FATAL: lock held", load_seconds=30), answer=False)
    sup = supervisor(tmp_path, store, adapter)
    with pytest.raises(EngineStartError, match="FATAL: lock held"):
        await sup.ensure_running()
    assert adapter.asked == ["fake:early:0: FATAL: lock held"]


async def test_a_raising_hook_is_its_plugins_fault(tmp_path: Path, store: EventStore) -> None:
    adapter = Asking(Behaviour(exit_code=7), answer=RuntimeError("boom"))
    sup = supervisor(tmp_path, store, adapter)
    with pytest.raises(PluginError, match=r"Asking\) raised RuntimeError: boom in on_exited"):
        await sup.ensure_running()


async def test_a_supervisor_that_knows_no_owned_engines_does_not_ask(
    tmp_path: Path, store: EventStore
) -> None:
    adapter = Asking(Behaviour(exit_code=7), answer=True)
    sup = Harness(tmp_path / "data", store, {"fake": adapter}).supervisor(KEY)
    assert sup.owned is None
    with pytest.raises(EngineStartError, match="before becoming ready"):
        await sup.ensure_running()
    assert adapter.asked == []
