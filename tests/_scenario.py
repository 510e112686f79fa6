"""A recorded scenario for the post-mortem tests: real engines, evictions, a crash, a lease.

:func:`record_scenario` runs three tiny real models (``alpha``, ``beta``, ``gamma``) through the
runtime with real ``llama-server`` processes, under a budget that fits two of them and never
three, and writes everything to one SQLite log:

1. ``alpha`` alone, asked twice (its real price and footprint size a budget for two, never three);
2. requests ``beta``; ``gamma`` (``beta`` evicted: fewer requests than ``alpha``, though
   ``alpha`` was used longer ago); ``beta`` (``gamma`` evicted, the same way); ``gamma``
   (``alpha`` evicted: as wanted as ``beta``, and used longer ago). Under plain LRU the first
   two victims would have been ``alpha``: the test of ``replay --verify`` relies on that;
3. ``beta``'s engine is killed (SIGKILL, unasked): ``engine.crashed``; the next ``beta`` request
   starts it again;
4. an ``image`` lease is held by ``render-job`` and released (in ``swap`` mode it unloads the
   ``llm`` engines first: ``beta`` and ``gamma``);
5. the budget is cut below one engine: a request for ``gamma`` is refused (``ledger.denied``);
   raised again, ``gamma`` starts (nothing else is resident: no eviction);
6. the runtime closes: every engine stops.

The :class:`Scenario` it returns says what happened, from the test's side, so post-mortem tests
can assert that the log alone tells the same story.

Recording takes real engine starts, so the suite records it once (the session fixture
``scenario`` in ``conftest.py``) and each test reads its own copy of the log.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from _rigs import LlamaRig, room_for
from hostler import EventStore, Runtime
from hostler.errors import CapacityDeniedError
from hostler.machines.engine import made_room

GIB = 2**30
MODELS = ("alpha", "beta", "gamma")
#: The requests after the first, in order (each to the model named), before the crash.
SEQUENCE = ("beta", "gamma", "beta", "gamma")


def key_of(name: str) -> str:
    """The engine key of model ``name`` (replica 0)."""
    return f"llamacpp:{name}:0"


@dataclass
class Scenario:
    """What the scenario did, seen from outside the log.

    Attributes:
        log: The SQLite log file.
        keys: Every engine key that ran.
        evicted: ``(victim, for_key)`` per eviction for room, in order.
        crashed: The engine key killed with SIGKILL.
        crashed_pid: Its pid.
        lease_holder: Who held the ``image`` lease.
        refused: The engine key whose start the cut budget refused.
        budget: The budget set (bytes).
        sessions: The session id of each request, by model.
    """

    log: Path
    keys: list[str]
    evicted: list[tuple[str, str]] = field(default_factory=list)
    crashed: str = ""
    crashed_pid: int = 0
    lease_holder: str = "render-job"
    refused: str = ""
    budget: int = 0
    sessions: dict[str, str] = field(default_factory=dict)


def _chat(port: int) -> str:
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.loads(response.read())["choices"][0]["finish_reason"])


async def _ask(rt: Runtime, name: str, scenario: Scenario) -> int:
    session = f"chat-{name}"
    scenario.sessions[name] = session
    async with rt.request(key_of(name), session=session, label=f"ask {name}") as port:
        await anyio.to_thread.run_sync(_chat, port)
        return int(port)


async def record_scenario(folder: Path) -> Scenario:
    """Run the scenario with real engines and return what happened (its log in ``folder``)."""
    await anyio.Path(folder).mkdir(parents=True, exist_ok=True)
    log = folder / "events.db"
    scenario = Scenario(log, [key_of(m) for m in MODELS])
    with EventStore.open(log) as store:
        rig = LlamaRig(folder, store, MODELS)
        async with rig.runtime() as rt:
            await _ask(rt, "alpha", scenario)
            await _ask(rt, "alpha", scenario)
            one = (await rt.memory.budget())["committed"]
            two = room_for(2, rig.price(key_of("beta")), one)  # room for two, never three
            rig.budget_gib = two / GIB
            scenario.budget = two  # under 1 GiB: a live budget would not bind (CB1)
            for name in SEQUENCE:
                await _ask(rt, name, scenario)
            victim = key_of("beta")
            status = rt.report.engine_status(victim)
            pid = status.pid if status is not None else None
            assert pid is not None
            scenario.crashed, scenario.crashed_pid = victim, pid
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 20
            while not any(
                r.type == "engine.crashed" for r in store.read_stream(f"engine/{victim}")
            ):
                if time.monotonic() > deadline:
                    raise AssertionError("the killed engine's crash was never recorded")
                await anyio.sleep(0.05)
            await _ask(rt, "beta", scenario)  # started again after its crash
            rt.arbiter.set_policy("swap")  # an exclusive lease: it unloads the llm engines first
            release = await rt.arbiter.acquire_lease("image", scenario.lease_holder)
            await anyio.sleep(0.3)  # held a while: a span wide enough to see in a timeline
            await release()
            rig.budget_gib = 0.5 * one / GIB  # below one engine: any start is refused
            scenario.refused = key_of("gamma")
            try:
                async with rt.request(scenario.refused, session="chat-gamma"):
                    raise AssertionError("a start the budget cannot hold was let through")
            except CapacityDeniedError:
                pass
            rig.budget_gib = two / GIB  # room again
            await _ask(rt, "gamma", scenario)
    scenario.evicted = _evictions(log)
    return scenario


def _evictions(log: Path) -> list[tuple[str, str]]:
    with EventStore.open(log) as store:
        return [
            (r.stream_id.removeprefix("engine/"), str(r.payload["decision"].get("for")))
            for r in store.read_all(types=["engine.stop_requested"])
            if made_room(r.payload["reason"], r.payload["decision"])  # not the lease's (GA1)
        ]
