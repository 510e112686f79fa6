"""Conversations survive a swap (issue 20), through ``hostler serve`` and the real ``llama-server``.

``hostler serve`` (the CLI, a real process) serves two tiny real models under a budget with
room for one engine; the official ``openai`` client holds a conversation (``user`` names its
session) on one, asks the other (which evicts the first), then comes back. The session's
prompt cache was saved before the eviction and is restored after the reload, so the next turn
evaluates only its new tokens; the log tells the story (``cache.saved``, ``cache.restored``).
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from _rigs import room_for
from hostler import EventStore
from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import (
    count,
    events,
    first_launch_costs,
    kill_leftovers,
    served_port,
    start_daemon,
    wait_for,
)
from _support import run_cli

MODELS = ("alpha", "beta")
#: A prompt of some hundreds of tokens: its re-evaluation is what a restore saves.
PROMPT = " ".join(f"the river {n} runs past the mill and the old stone bridge" for n in range(30))


def _config(folder: Path, names: tuple[str, ...], *, autostart: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        write_tiny_llama(folder / f"{name}.gguf")
    config = folder / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        + "".join(
            f'\n[[engines]]\nkey = "llamacpp:{n}:0"\nmodel = "{n}.gguf"\nctx = 2048\n'
            f"autostart = {'true' if autostart else 'false'}\n"
            for n in names
        )
    )
    return config


@dataclass(frozen=True)
class _Run:
    data: Path
    client: openai.OpenAI


def _room_for_one(tmp_path: Path) -> int:
    """A budget with room for one engine here (whole MiB), from a daemon of its own."""
    probe = tmp_path / "probe"
    costs = first_launch_costs(
        _config(probe, MODELS[:1], autostart=True),
        probe / "data",
        probe / "ledger.db",
        "llamacpp:alpha:0",
    )
    return room_for(1, *costs) // 2**20 * 2**20


@contextlib.contextmanager
def _serving(run: Path, budget: int) -> Iterator[_Run]:
    """``hostler serve`` on ``run``'s config and data under ``budget``, stopped (SIGTERM) after."""
    config = run / "hostler.toml" if (run / "hostler.toml").exists() else _config(run, MODELS)
    data, log = run / "data", run / "serve.log"
    env = {"HOSTLER_CAPACITY_BUDGET_GB": repr(budget / 2**30)}
    log.unlink(missing_ok=True)
    server = start_daemon(config, data, log, command="serve", extra=("--port", "0"), env=env)
    try:
        base = f"http://127.0.0.1:{served_port(log)}/v1"
        yield _Run(data, openai.OpenAI(base_url=base, api_key="-", max_retries=0))
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        kill_leftovers(data)


def _turn(run: _Run, model: str, messages: list[Any], session: str | None) -> Any:
    """One turn; ``session`` is the body's ``user`` (how hostler names a conversation)."""
    return run.client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=4,
        temperature=0,
        user=session or openai.omit,
    )


def _timings(answer: Any) -> dict[str, int]:
    extra = answer.model_extra or {}
    timings = extra.get("timings")
    assert isinstance(timings, dict), extra
    return {"prompt_n": int(timings["prompt_n"]), "cache_n": int(timings.get("cache_n", 0))}


def _cache_events(data: Path, key: str) -> list[tuple[str, dict[str, Any]]]:
    return [(t, p) for s, t, p in events(data) if s == f"cache/{key}"]


@pytest.mark.slow
def test_a_sessions_turn_after_its_engine_was_evicted_or_the_daemon_restarted_reads_only_new_tokens(
    tmp_path: Path,
) -> None:
    key = "llamacpp:alpha:0"
    budget = _room_for_one(tmp_path)
    history: list[Any] = [{"role": "user", "content": PROMPT}]
    with _serving(tmp_path / "run", budget) as run:
        first = _timings(_turn(run, "alpha", history, "ana"))
        assert first["prompt_n"] > 200 and first["cache_n"] == 0  # cold: the whole prompt
        history.append({"role": "user", "content": "and then?"})
        warm = _timings(_turn(run, "alpha", history, "ana"))
        # the engine's own cache, no swap: all but the prompt's end (the chat template closes
        # a turn differently once another follows it)
        assert warm["cache_n"] >= 0.95 * first["prompt_n"]

        _turn(run, "beta", [{"role": "user", "content": "hi"}], None)  # evicts alpha
        assert count(run.data, key, "engine.stopped") == 1
        history.append({"role": "user", "content": "and after that?"})
        back = _timings(_turn(run, "alpha", history, "ana"))
        assert count(run.data, key, "engine.ready") == 2  # reloaded
        # only the new tokens were evaluated: the rest came back from the session's file
        assert back["cache_n"] >= 0.95 * (warm["cache_n"] + warm["prompt_n"])
        assert back["prompt_n"] < 0.1 * (back["cache_n"] + back["prompt_n"])
        # the request path's cache events are written in the next batch (every 0.5 s)
        wait_for(lambda: any(t == "cache.restored" for t, _ in _cache_events(run.data, key)))
        told = _cache_events(run.data, key)
        saved = [p for t, p in told if t == "cache.saved"]
        restored = [p for t, p in told if t == "cache.restored"]
        assert [(p["session"], p["cause"], p["error"]) for p in saved] == [("ana", "evicted", "")]
        assert saved[0]["tokens"] >= warm["cache_n"] + warm["prompt_n"]
        assert saved[0]["bytes"] > 0
        assert [(p["session"], p["error"]) for p in restored] == [("ana", "")]
        assert restored[0]["tokens"] == saved[0]["tokens"]
        # the operator's view of the new launch's cache (CC10): one turn, a hit from disk
        base = str(run.client.base_url).removesuffix("/").removesuffix("/v1")
        stats = httpx.get(f"{base}/api/cache/{key}", timeout=30).json()
        assert (stats["hits"], stats["misses"]) == (1, 0)
        assert stats["sources"] == {"memory": 0, "disk": 1, "prefix": 0, "fresh": 0}
        assert stats["sessions"] == ["ana"] and stats["entries"] == 1
    # the shutdown saved the session again (SIGTERM: within its second for saves)
    told = _cache_events(run.data, key)
    assert [(p["session"], p["cause"]) for t, p in told if t == "cache.saved"][-1] == (
        "ana",
        "shutdown",
    )
    with _serving(tmp_path / "run", budget) as run:  # a new daemon: the engine starts afresh
        history.append({"role": "user", "content": "and in the end?"})
        again = _timings(_turn(run, "alpha", history, "ana"))
        assert count(run.data, key, "engine.ready") == 3
        assert again["cache_n"] >= 0.95 * (back["cache_n"] + back["prompt_n"])
        assert again["prompt_n"] < 0.1 * (again["cache_n"] + again["prompt_n"])
    # explain tells the session's cache story, in order, from the log alone
    explained = run_cli("explain", "session=ana", "--db", str(run.data / "events.db"), "--json")
    assert explained.returncode == 0, explained.stderr
    story = [
        (f["kind"], f["cause"].get("cause"))
        for f in json.loads(explained.stdout)["findings"]
        if f["kind"].startswith("cache-")
    ]
    assert story == [
        ("cache-saved", "evicted"),
        ("cache-restored", None),
        ("cache-saved", "shutdown"),
        ("cache-restored", None),
        ("cache-saved", "shutdown"),  # the second daemon's shutdown
    ]
    text = run_cli("explain", "session=ana", "--db", str(run.data / "events.db")).stdout
    assert f"session ana's prompt cache saved on {key} before its engine was evicted: " in text
    assert f"session ana's prompt cache restored on {key} before its turn: " in text
    # a one-shot (no session) was never bound, saved or restored
    with EventStore.open(run.data / "events.db") as store:
        beta = [r.type for r in store.read_stream("cache/llamacpp:beta:0")]
    assert "cache.saved" not in beta and "cache.restored" not in beta


def _files(data: Path) -> dict[str, int]:
    """The session files on disk under the data directory, with their sizes."""
    return {p.name: p.stat().st_size for p in sorted(data.rglob("sess-*.bin"))}


@pytest.mark.slow
def test_session_files_are_kept_within_their_engines_cache_budget(tmp_path: Path) -> None:
    """CC14 through ``hostler serve``: the files count with their real size; over the budget
    the least recently used session's file is deleted, recorded, and its next turn is cold."""
    key = "llamacpp:alpha:0"
    budget = _room_for_one(tmp_path)
    ana = [{"role": "user", "content": PROMPT}]
    bo = [{"role": "user", "content": PROMPT.replace("river", "road")}]
    with _serving(tmp_path / "run", budget) as run:
        base = str(run.client.base_url).removesuffix("/").removesuffix("/v1")
        first = _timings(_turn(run, "alpha", ana, "ana"))
        _turn(run, "beta", [{"role": "user", "content": "hi"}], None)  # evicts alpha: ana saved
        (size,) = _files(run.data).values()
        stats = httpx.get(f"{base}/api/cache/{key}", timeout=30).json()
        assert (stats["running"], stats["files"], stats["file_bytes"]) == (False, 1, size)
        assert stats["total_bytes"] == size  # its real size, not 100 KiB a token
        assert size < first["prompt_n"] * 102_400
        assert stats["bytes_per_token"] * first["prompt_n"] >= size
        # room for one session's file and a half
        token = (run.data / "token").read_text().strip()
        answer = httpx.put(
            f"{base}/api/cache/{key}/budget",
            json={"bytes": size * 3 // 2},
            headers={"authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert _files(run.data) == {"sess-ana.bin": size}
        _timings(_turn(run, "alpha", bo, "bo"))  # alpha back: bo's cache and ana's file
        # bo's turn counts what its file will be: with ana's file, over 1.5 files: ana's goes
        wait_for(lambda: "sess-ana.bin" not in _files(run.data))
        _turn(run, "beta", [{"role": "user", "content": "hi"}], None)  # evicts alpha: bo saved
        assert list(_files(run.data)) == ["sess-bo.bin"]
        stats = httpx.get(f"{base}/api/cache/{key}", timeout=30).json()
        assert (stats["files"], stats["sessions"]) == (1, ["bo"])
        assert stats["file_bytes"] == _files(run.data)["sess-bo.bin"] <= size * 3 // 2
        shown = run_cli("ps", "--url", base)  # the operator's terminal view of the same
        assert shown.returncode == 0, shown.stderr
        caches = shown.stdout.split("prompt caches", 1)[1].splitlines()
        row = next(line.split() for line in caches if line.startswith(key))
        assert row[1:3] == ["1", "1"]  # one session, one file
        ana.append({"role": "user", "content": "and then?"})
        cold = _timings(_turn(run, "alpha", ana, "ana"))
        assert cold["cache_n"] == 0 and cold["prompt_n"] > 200  # its file was deleted: cold
        wait_for(lambda: any(t == "cache.evicted" for t, _ in _cache_events(run.data, key)))
    evicted = [p for t, p in _cache_events(run.data, key) if t == "cache.evicted"]
    assert (evicted[0]["ids"], evicted[0]["reason"]) == (["ana"], "watermark")
    assert evicted[0]["decision"]["budget"] == size * 3 // 2
    text = run_cli("explain", "session=ana", "--db", str(run.data / "events.db")).stdout
    assert (
        f"session ana's prompt cache dropped from {key}: its engine's caches reached their "
        "budget (" in text
    ), text
    assert "least recently used first" in text


@pytest.mark.slow
def test_an_engine_adopted_after_a_daemon_sigkill_keeps_its_sessions_and_saves_them(
    tmp_path: Path,
) -> None:
    """CC13 across a crash of ``hostler serve``: the engine runs on; the next daemon adopts it
    with the spec its spawn recorded (``engine.spawned`` v3), so the session keeps its slot
    (a ``memory`` turn) and is saved before the adopted engine's eviction, then restored."""
    key = "llamacpp:alpha:0"
    budget = _room_for_one(tmp_path)
    run_dir = tmp_path / "run"
    config, data = _config(run_dir, MODELS), run_dir / "data"
    env = {"HOSTLER_CAPACITY_BUDGET_GB": repr(budget / 2**30)}
    history: list[Any] = [{"role": "user", "content": PROMPT}]
    first_log = run_dir / "first.log"
    crashed = start_daemon(config, data, first_log, command="serve", extra=("--port", "0"), env=env)
    try:
        base = f"http://127.0.0.1:{served_port(first_log)}/v1"
        one = _Run(data, openai.OpenAI(base_url=base, api_key="-", max_retries=0))
        first = _timings(_turn(one, "alpha", history, "ana"))
        assert first["prompt_n"] > 200
        crashed.send_signal(signal.SIGKILL)  # the daemon dies; its engine runs on
        assert crashed.wait(60) == -signal.SIGKILL
        with _serving(run_dir, budget) as run:
            wait_for(lambda: count(run.data, key, "engine.adopted") == 1)
            history.append({"role": "user", "content": "and then?"})
            kept = _timings(_turn(run, "alpha", history, "ana"))  # on the adopted engine
            assert count(run.data, key, "engine.ready") == 1  # never reloaded
            assert kept["cache_n"] >= 0.95 * first["prompt_n"]
            _turn(run, "beta", [{"role": "user", "content": "hi"}], None)  # evicts alpha
            history.append({"role": "user", "content": "and after that?"})
            back = _timings(_turn(run, "alpha", history, "ana"))
            assert count(run.data, key, "engine.ready") == 2  # reloaded
            assert back["prompt_n"] < 0.1 * (back["cache_n"] + back["prompt_n"])
            wait_for(lambda: any(t == "cache.restored" for t, _ in _cache_events(data, key)))
    finally:
        if crashed.poll() is None:
            crashed.kill()
        kill_leftovers(data)
    told = [(t, p.get("session"), p.get("cause")) for t, p in _cache_events(data, key)]
    assert ("cache.saved", "ana", "evicted") in told  # the adopted engine's stop saved it
    assert told.index(("cache.saved", "ana", "evicted")) < told.index(
        ("cache.restored", "ana", None)
    )
