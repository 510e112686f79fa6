"""What-if against live runs: real ``llama-server`` engines of tiny models, two budgets (PM25).

One fixed sequence of requests over three models is run live twice, under a budget that fits
one engine (A) and one that fits two (B). The what-if of log A under budget B must give the
evictions, refusals and cold starts log B records, per engine and in total, and the other way
round; and the simulator under a log's own settings must give what that log records.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import anyio
import pytest

from _rigs import LlamaRig, room_for
from hostler import EventStore
from hostler.postmortem.figures import Figures, recorded_figures
from hostler.postmortem.whatif import simulate
from hostler.postmortem.workload import Settings, Workload, workload_from

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

GIB = 2**30
MODELS = ("alpha", "beta", "gamma")
#: The fixed sequence: with room for two, demand decides the victim (alpha is asked most).
SEQUENCE = ("alpha", "beta", "alpha", "gamma", "alpha", "beta", "gamma", "beta", "alpha")
#: PM25: sequential requests never queue, live or simulated; what the live log shows is the
#: time from enqueue to dispatch inside one event-loop turn (microseconds), so 50 ms is far
#: above that noise and far below any real wait (a cold start here is about half a second).
WAIT_TOLERANCE = 0.05


def key_of(name: str) -> str:
    return f"llamacpp:{name}:0"


def chat(port: int) -> str:
    body = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return str(json.loads(response.read())["choices"][0]["finish_reason"])


async def one_engine_costs(tmp_path: Path) -> tuple[int, int]:
    """What one engine's first start reserves here (its price) and what it then holds."""
    folder = tmp_path / "learn"
    folder.mkdir()
    with EventStore.open(folder / "events.db") as store:
        rig = LlamaRig(folder, store, MODELS)
        async with rig.runtime() as rt:
            async with rt.request(key_of("alpha")) as port:
                await anyio.to_thread.run_sync(chat, port)
            committed = int((await rt.memory.budget())["committed"])
        return max(rig.price(key_of(name)) for name in MODELS[1:]), committed


async def live(tmp_path: Path, name: str, budget_gib: float) -> tuple[Workload, Figures]:
    """Run the sequence under a budget; the log's workload and its recorded figures."""
    folder = tmp_path / name
    folder.mkdir()
    with EventStore.open(folder / "events.db") as store:
        rig = LlamaRig(folder, store, MODELS)
        rig.budget_gib = budget_gib
        async with rig.runtime() as rt:
            for model in SEQUENCE:
                async with rt.request(key_of(model), session=model) as port:
                    assert await anyio.to_thread.run_sync(chat, port) in {"length", "stop"}
        rows = list(store.read_all())
    return workload_from(rows), recorded_figures(rows)


def counts(figures: Figures) -> dict[str, tuple[int, int, int, int]]:
    found = {key: f.counts() for key, f in figures.by_key.items()}
    found["total"] = figures.total.counts()
    return found


def assert_waits_close(simulated: Figures, happened: Figures) -> None:
    for key, live_figures in happened.by_key.items():
        a, b = simulated.by_key[key].waits, live_figures.waits
        assert a.count == b.count
        for x, y in ((a.median, b.median), (a.p95, b.p95), (a.max, b.max)):
            assert abs(x - y) <= WAIT_TOLERANCE, (key, a, b)


async def test_whatif_of_one_budget_gives_what_the_other_budget_recorded(tmp_path: Path) -> None:
    one = await one_engine_costs(tmp_path)
    log_a, happened_a = await live(tmp_path, "a", room_for(1, *one) / GIB)  # one engine fits
    log_b, happened_b = await live(tmp_path, "b", room_for(2, *one) / GIB)  # two, never three
    budget_a, budget_b = log_a.settings.budget, log_b.settings.budget
    assert budget_a < budget_b
    # the live runs differ as budgets say: the bigger one evicts less and starts fewer
    assert happened_a.total.evictions > happened_b.total.evictions > 0
    assert happened_a.total.cold_starts > happened_b.total.cold_starts
    assert happened_a.total.requests == happened_b.total.requests == len(SEQUENCE)
    # each log replayed under its own settings gives what it recorded
    assert counts(simulate(log_a, log_a.settings)) == counts(happened_a)
    assert counts(simulate(log_b, log_b.settings)) == counts(happened_b)
    # the what-if of each log under the other's budget gives what the other recorded
    a_as_b = simulate(log_a, Settings(budget_b, log_a.settings.policy, log_a.settings.spillover))
    b_as_a = simulate(log_b, Settings(budget_a, log_b.settings.policy, log_b.settings.spillover))
    assert counts(a_as_b) == counts(happened_b)
    assert counts(b_as_a) == counts(happened_a)
    assert_waits_close(a_as_b, happened_b)
    assert_waits_close(b_as_a, happened_a)
