"""The what-if of a real ``hostler serve`` run, under the budget it ran with, is that run (issue 19).

``hostler serve`` (the CLI, a real process) serves three tiny real models through the real
``llama-server`` under a budget with room for one engine; the official ``openai`` client asks
them in turn. ``hostler whatif LOG`` of that log, under the log's own budget, policy and slots,
must replay exactly the evictions, refusals and cold starts that happened, per engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from _rigs import room_for
from hostler import EventStore
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama

from _daemons import count, first_launch_costs, kill_leftovers, served_port, start_daemon, wait_for
from _support import run_cli

MODELS = ("alpha", "beta", "gamma")
#: ``big`` is priced over the budget: its request is refused, nothing is unloaded for it.
SEQUENCE = ("alpha", "beta", "alpha", "big", "gamma", "alpha", "beta", "gamma", "beta", "alpha")
BIG_CTX = 131072
#: After these steps of SEQUENCE: alpha's engine is SIGKILLed; gamma's is unloaded by hand;
#: the budget is raised live, to room for all three.
CRASH_AFTER, UNLOAD_AFTER, RAISE_AFTER = 5, 7, 8
FIGURES = ("requests", "evictions", "refusals", "cold_starts")


def _config(folder: Path, names: tuple[str, ...], ledger: str, *, big: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        write_tiny_llama(folder / f"{name}.gguf")
    engines = [(n, 512) for n in names]
    if big:  # its KV cache alone is more than the budget
        write_tiny_llama(folder / "big.gguf", TinyModel(ctx=BIG_CTX))
        engines.append(("big", BIG_CTX))
    config = folder / "hostler.toml"
    config.write_text(
        f'[daemon]\nidle_timeout = 0\nledger = "{ledger}"\n'
        + "".join(
            f'\n[[engines]]\nkey = "llamacpp:{n}:0"\nmodel = "{n}.gguf"\nctx = {ctx}\n'
            "autostart = false\n"
            for n, ctx in engines
        )
    )
    return config


def _one_engines_costs(tmp_path: Path) -> tuple[int, int]:
    """What one engine's first start reserves and then holds here (a daemon of its own)."""
    folder = tmp_path / "probe"
    config = _config(folder, ("alpha",), "ledger.db")
    config.write_text(config.read_text().replace("autostart = false", "autostart = true"))
    return first_launch_costs(config, folder / "data", folder / "ledger.db", "llamacpp:alpha:0")


def _pid(base: str, key: str) -> int:
    engines = httpx.get(f"{base.removesuffix('/v1')}/api/engines", timeout=30).json()
    return int(next(e["pid"] for e in engines["engines"] if e["key"] == key))


@dataclass(frozen=True)
class _Run:
    budget: int
    data: Path
    base: str
    client: openai.OpenAI


@contextlib.contextmanager
def _serving(tmp_path: Path, names: tuple[str, ...], *, big: bool = False) -> Iterator[_Run]:
    """``hostler serve`` under room for one engine (whole MiB: exact in GB), stopped after."""
    budget = room_for(1, *_one_engines_costs(tmp_path)) // 2**20 * 2**20
    run = tmp_path / "run"
    config = _config(run, names, "ledger.db", big=big)  # the tour's: a ledger file of its own
    data, log = run / "data", run / "serve.log"
    env = {"HOSTLER_CAPACITY_BUDGET_GB": repr(budget / 2**30)}
    server = start_daemon(config, data, log, command="serve", extra=("--port", "0"), env=env)
    try:
        base = f"http://127.0.0.1:{served_port(log)}/v1"
        yield _Run(budget, data, base, openai.OpenAI(base_url=base, api_key="-", max_retries=0))
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        kill_leftovers(data)


def _ask(client: openai.OpenAI, model: str) -> object:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    ).choices


def _figures(report: dict[str, object], side: str) -> dict[str, tuple[int, ...]]:
    by_key = report[side]["by_key"]  # type: ignore[index]
    return {key: tuple(f[name] for name in FIGURES) for key, f in by_key.items()}


@pytest.mark.slow
def test_whatif_of_a_serve_run_under_its_own_budget_replays_what_happened(tmp_path: Path) -> None:
    with _serving(tmp_path, MODELS, big=True) as run:
        budget, data, base = run.budget, run.data, run.base
        higher = max(4 * budget, 2**30)  # CB1: an explicit budget is at least 1 GiB
        token = (data / "token").read_text().strip()
        for step, model in enumerate(SEQUENCE):
            if model == "big":
                with pytest.raises(openai.APIStatusError) as refused:
                    _ask(run.client, model)
                assert refused.value.status_code == 503, refused.value.message
                continue
            assert _ask(run.client, model), model
            key = f"llamacpp:{model}:0"
            if step == CRASH_AFTER:  # the engine dies: no request asked for that
                os.kill(_pid(base, key), signal.SIGKILL)
                wait_for(lambda: count(data, key, "engine.crashed") == 1, timeout=60)  # noqa: B023
            elif step == UNLOAD_AFTER:  # an operator unloads it
                unload = httpx.post(
                    f"{base.removesuffix('/v1')}/api/engines/{key}/unload",
                    headers={"authorization": f"Bearer {token}"},
                    timeout=60,
                )
                assert unload.json()["unloaded"] is True, unload.text
            elif step == RAISE_AFTER:
                raised = httpx.put(
                    f"{base.removesuffix('/v1')}/api/budget",
                    json={"bytes": higher},
                    headers={"authorization": f"Bearer {token}"},
                    timeout=60,
                )
                assert raised.status_code == 200, raised.text
    whatif = run_cli("whatif", str(data / "events.db"), "--json")
    assert whatif.returncode == 0, whatif.stderr
    report = json.loads(whatif.stdout)
    assert report["recorded_settings"]["budget"] == higher  # the last: the raise
    assert report["recorded_settings"]["follow_budget"] is True
    happened, replayed = _figures(report, "happened"), _figures(report, "replayed")
    # every switch of model evicted the one before (room for one) but after the crash and the
    # unload, which left the room free, and after the raise; big was refused, once
    served = [m for m in SEQUENCE if m != "big"]
    assert sum(f[1] for f in happened.values()) == len(served) - 1 - 3
    assert happened["llamacpp:alpha:0"][3] == 4  # cold starts: the crash cost one
    assert happened["llamacpp:big:0"] == (1, 0, 1, 0)
    assert replayed == happened
    # the clients' whole waits (queue.served): as many replayed as happened, and a replayed
    # one holds the cold start that its queue wait leaves out
    said = {side: report[side]["total"] for side in ("happened", "replayed")}
    assert said["replayed"]["served"]["count"] == said["happened"]["served"]["count"] > 0
    assert said["replayed"]["served"]["max"] > said["replayed"]["waits"]["max"]
    assert said["happened"]["served"]["max"] > said["happened"]["waits"]["max"]
    # the first request's client waited for alpha's cold start: explain says so, in all
    told = run_cli("explain", "llamacpp:alpha:0#1", "--db", str(data / "events.db"), "--json")
    assert told.returncode == 0, told.stderr
    findings = {f["kind"]: f for f in json.loads(told.stdout)["findings"]}
    with EventStore.open(data / "events.db") as store:
        rows = list(store.read_stream("engine/llamacpp:alpha:0"))
    started = next(r.payload["at"] for r in rows if r.type == "engine.start_requested")
    ready = next(r.payload["at"] for r in rows if r.type == "engine.ready")
    queued = findings["dispatched"]["cause"]["waited"]
    whole = findings["served"]["cause"]["waited"]
    assert queued < 0.01 < ready - started <= whole  # the slot at once, the engine's start after


@pytest.mark.slow
def test_every_cold_start_is_logged_after_the_enqueue_of_the_request_it_was_made_for(
    tmp_path: Path,
) -> None:
    """Break of 2026-12-03: queue events, written in batches, came after the start they caused.

    A sequential client asks alpha, beta, alpha under room for one: each
    ``engine.start_requested`` must come (by ``seq``) while a request of that engine is in its
    queue: one ``queue.enqueued`` more than ``queue.released``/``queue.cancelled`` before it.
    """
    with _serving(tmp_path, ("alpha", "beta")) as run:
        for model in ("alpha", "beta", "alpha"):
            assert _ask(run.client, model), model
    data = run.data
    with EventStore.open(data / "events.db") as store:
        rows = list(store.read_all())
    starts: list[tuple[str, int]] = []
    for row in rows:
        if row.type != "engine.start_requested":
            continue
        key = row.stream_id.removeprefix("engine/")
        before = [r for r in rows if r.seq < row.seq and r.stream_id == f"queue/{key}"]
        joined = sum(1 for r in before if r.type == "queue.enqueued")
        ended = sum(1 for r in before if r.type in {"queue.released", "queue.cancelled"})
        starts.append((key, joined - ended))
    assert starts == [("llamacpp:alpha:0", 1), ("llamacpp:beta:0", 1), ("llamacpp:alpha:0", 1)]


@pytest.mark.slow
def test_whatif_replays_two_clients_asking_at_once_as_it_happened(tmp_path: Path) -> None:
    """Break of 2026-12-03: alpha up (room for one), two clients then ask beta and alpha at once.

    What happened: alpha's request is served by the running alpha while beta's start is
    priced, then alpha is evicted for beta. The replay made room the instant beta was queued
    (a cold start and an eviction more); it now plans a start as late after its request as
    the log's starts were planned (Model.plan).
    """
    with _serving(tmp_path, ("alpha", "beta")) as run:
        errors: list[BaseException] = []

        def ask(model: str) -> None:
            try:
                _ask(run.client, model)
            except BaseException as error:
                errors.append(error)

        ask("alpha")
        clients = [threading.Thread(target=ask, args=(m,)) for m in ("beta", "alpha")]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(120)
        assert not errors, errors
    data = run.data
    whatif = run_cli("whatif", str(data / "events.db"), "--json")
    assert whatif.returncode == 0, whatif.stderr
    report = json.loads(whatif.stdout)
    happened, replayed = _figures(report, "happened"), _figures(report, "replayed")
    assert sum(f[0] for f in happened.values()) == 3  # every request is in the log
    assert replayed == happened
