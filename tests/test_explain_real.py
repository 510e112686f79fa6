"""``hostler explain`` on a log recorded by the real runtime: real ``llama-server`` engines.

The scenario: three tiny models under a budget that fits two, so starting the third evicts the
least wanted idle one (PP4); one engine killed with SIGKILL (a crash) and started again; a GPU
lease in swap mode that unloads the idle engines (GA1); and a start the budget can never fit
(refused). Every engine's story is then told by ``hostler explain``, and each test asserts the
causes it cites against the recorded decisions.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from _rigs import LlamaRig, room_for
from hostler import EventStore
from hostler.cli import main
from hostler.errors import HostlerError
from hostler.replay import replay
from test_runtime_llama import chat, key_of

pytestmark = pytest.mark.slow

GIB = 2**30
ALPHA, BETA, GAMMA = key_of("alpha"), key_of("beta"), key_of("gamma")


async def record(tmp_path: Path) -> Path:
    """Run the scenario; return the log's path."""
    path = tmp_path / "events.db"
    with EventStore.open(path) as store:
        rig = LlamaRig(tmp_path, store, ("alpha", "beta", "gamma"))
        async with rig.runtime() as rt:
            await rt.bind("llamacpp", "alpha", "s-alpha")
            async with rt.request(ALPHA, session="s-alpha") as port:
                await anyio.to_thread.run_sync(chat, port)
            one = (await rt.memory.budget())["committed"]
            rig.budget_gib = room_for(2, rig.price(BETA), one) / GIB  # two fit, never three
            for key in (BETA, ALPHA, ALPHA, GAMMA, BETA):
                async with rt.request(key, session=f"s-{key.split(':')[1]}") as port:
                    await anyio.to_thread.run_sync(chat, port)
            pid = replay(store).engines[BETA].pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            for _ in range(200):  # the supervisor notices the death
                if replay(store).engines[BETA].state == "backoff":
                    break
                await anyio.sleep(0.02)
            async with rt.request(BETA, session="s-beta") as port:
                await anyio.to_thread.run_sync(chat, port)
            rt.arbiter.set_policy("swap")
            release = await rt.arbiter.acquire_lease("image", "comfy")
            await release()
            rig.budget_gib = 0.5 * one / GIB  # nothing fits any more, whatever goes
            with pytest.raises(HostlerError):
                async with rt.request(GAMMA) as port:
                    pass
    return path


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Not the shared scenario of conftest.py: here the much-used ``alpha`` is kept at every
    # eviction and the lease finds ``alpha`` and ``beta`` resident, where the shared one evicts
    # ``alpha`` (as wanted as ``beta``, used longer ago) and its lease unloads ``beta`` and
    # ``gamma``. Recording this one takes about 0.4 s.
    return anyio.run(record, tmp_path_factory.mktemp("explain"))


def explained(capsys: pytest.CaptureFixture[str], log: Path, target: str) -> dict[str, Any]:
    assert main(["explain", target, "--db", str(log), "--json"]) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


def of(document: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in document["findings"] if f["kind"] == kind]


def payloads(log: Path, type_name: str) -> list[tuple[int, dict[str, Any]]]:
    with EventStore.open(log) as store:
        return [(r.seq, r.payload) for r in store.read_all(types=[type_name])]


def test_each_eviction_cites_the_victims_demand_against_the_others(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plans = [(seq, p) for seq, p in payloads(log, "pool.room_planned") if p["evict"]]
    assert len(plans) >= 2
    for seq, plan in plans:
        (victim,) = plan["evict"]
        story = explained(capsys, log, victim)
        (line,) = [f for f in of(story, "victim") if f["seq"] == seq]
        figures = {c["key"]: c for c in plan["decision"]["candidates"]}
        mine = figures.pop(victim)
        (other,) = figures.values()
        assert other["key"] == ALPHA  # the much-used engine is kept every time
        assert mine["recent_hits"] < other["recent_hits"]
        assert line["cause"]["victim"]["recent_hits"] == mine["recent_hits"]
        assert line["cause"]["others"][0]["recent_hits"] == other["recent_hits"]
        assert (
            line["cause"]["policy"] == "demand-lru" and line["cause"]["for_key"] == plan["for_key"]
        )
        hits = mine["recent_hits"]
        assert (
            f"make room for {plan['for_key']}" in line["text"]
            and f"policy demand-lru v1: {hits} request{'' if hits == 1 else 's'} in the last 60 s"
            in line["text"]
            and f"vs {ALPHA}: {other['recent_hits']} requests in the last 60 s" in line["text"]
        )
        stops = [f for f in of(story, "stop") if f["cause"].get("rule") == "PP4"]
        assert any(f["seq"] > seq and f["cause"]["for"] == plan["for_key"] for f in stops)
        # and the engine it made room for says what it needed and who went
        needy = explained(capsys, log, plan["for_key"])
        (room,) = [f for f in of(needy, "room") if f["seq"] == seq]
        assert room["cause"]["victims"] == [victim] and room["cause"]["shortfall"] > 0


def test_the_killed_engine_is_explained_as_a_crash_and_a_restart(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    story = explained(capsys, log, BETA)
    (crash,) = of(story, "crashed")
    assert crash["cause"]["signal"] == signal.SIGKILL and crash["cause"]["exit_code"] is None
    assert crash["cause"]["reached_ready"] is True and crash["cause"]["panic_kind"] is None
    assert crash["text"].startswith("crashed: killed by signal 9 (SIGKILL); no panic line")
    (restart,) = of(story, "restart")
    assert restart["seq"] > crash["seq"]
    (recorded,) = payloads(log, "engine.crashed")
    assert crash["seq"] == recorded[0]


def test_the_lease_unloads_are_explained_with_the_lease(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (grant,) = payloads(log, "lease.granted")
    for key in (ALPHA, BETA):
        story = explained(capsys, log, key)
        # in swap mode the lease takes the card from the llm slot: its idle engines go (GA1)
        unloads = [f for f in of(story, "stop") if f["cause"].get("rule") == "GA1"]
        assert len(unloads) == 1
        assert unloads[0]["cause"]["lease_seq"] == grant[0]
        assert unloads[0]["cause"]["holder"] == "comfy" and unloads[0]["cause"]["slot"] == "image"
        assert any(f["cause"].get("what") == "granted" for f in of(story, "lease"))


def test_the_start_that_can_never_fit_is_explained_as_refused(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    story = explained(capsys, log, GAMMA)
    refusals = of(story, "refused")
    assert refusals, story
    last = refusals[-1]["cause"]
    assert last.get("shortfall", 0) > 0
    assert refusals[-1]["seq"] > max(f["seq"] for f in of(story, "victim"))


def test_every_engine_in_the_log_has_a_story_from_admission_to_its_last_stop(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with EventStore.open(log) as store:
        engines = replay(store).engines
    assert set(engines) == {ALPHA, BETA, GAMMA}
    for key, engine in engines.items():
        story = explained(capsys, log, key)
        kinds = [f["kind"] for f in story["findings"]]
        assert story["target"]["kind"] == "engine"
        assert kinds.count("admitted") == kinds.count("start") + kinds.count("restart")
        assert kinds.count("stopped") + kinds.count("crashed") == engine.starts
        seqs = [f["seq"] for f in story["findings"]]
        assert seqs == sorted(seqs)
    # the text form cites the same seqs
    assert main(["explain", BETA, "--db", str(log)]) == 0
    text = capsys.readouterr().out
    assert "crashed: killed by signal 9 (SIGKILL)" in text and " seq " in text
