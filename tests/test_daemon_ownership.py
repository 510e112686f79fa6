"""Every live engine has one owner: real daemons, a shared ledger, SIGKILL at random moments."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _rigs import room_for
from hostler import EventStore, replay
from hostler.drivers.host_ledger import catch_up
from hostler.events.ledger import LEDGER_STREAM
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama

from _daemons import (
    alive,
    count,
    daemon_starts,
    events,
    first_launch_costs,
    kill_leftovers,
    start_daemon,
    token_holders,
    wait_for,
)

KEYS = ("llamacpp:alpha:0", "llamacpp:beta:0")


def write_config(path: Path, keys: tuple[str, ...], ledger: Path, models: Path) -> Path:
    path.write_text(
        f'[daemon]\nidle_timeout = 0\nhealth_interval = 5\nledger = "{ledger}"\n'
        + "".join(
            f'\n[[engines]]\nkey = "{key}"\nmodel = "{models / key.split(":")[1]}.gguf"\n'
            "ctx = 512\n"
            for key in keys
        )
    )
    return path


@pytest.fixture
def models(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    write_tiny_llama(folder / "alpha.gguf", TinyModel(seed=1))
    write_tiny_llama(folder / "beta.gguf", TinyModel(seed=2))
    return folder


@pytest.fixture
def datas(tmp_path: Path) -> Iterator[list[Path]]:
    folders = [tmp_path / f"data{i}" for i in range(3)]
    yield folders
    for folder in folders:
        kill_leftovers(folder)


def prefix_of(data: Path) -> str:
    return (data / "daemon-id").read_text().strip()


def ledger_state(ledger: Path):  # type: ignore[no-untyped-def]
    with EventStore.open(ledger) as store:
        return catch_up(store)


def test_an_adopted_engine_that_is_not_configured_is_stopped(
    tmp_path: Path, models: Path, datas: list[Path]
) -> None:
    """Break 3: reconcile adopted it and re-reserved it, but nothing supervised it."""
    data, ledger = datas[0], tmp_path / "ledger.db"
    both = write_config(tmp_path / "both.toml", KEYS, ledger, models)
    first = start_daemon(both, data, tmp_path / "d1.log")
    try:
        wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    with EventStore.open(data / "events.db") as store:
        beta_pid = replay(store).engines[KEYS[1]].pid
    assert alive(beta_pid)
    only_alpha = write_config(tmp_path / "alpha.toml", KEYS[:1], ledger, models)
    second = start_daemon(only_alpha, data, tmp_path / "d2.log")
    try:
        wait_for(lambda: len(daemon_starts(data)) == 2)
        wait_for(lambda: count(data, KEYS[1], "engine.stopped") == 1)
        assert not alive(beta_pid)
        stop = [
            p
            for s, t, p in events(data)
            if s == f"engine/{KEYS[1]}" and t == "engine.stop_requested"
        ]
        assert stop[-1]["reason"] == "unconfigured"
        state = ledger_state(ledger)
        assert {key for _, key in state.reservations} == {KEYS[0]}
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    assert token_holders(prefix_of(data)) == []


def test_three_daemons_one_ledger_one_engine(
    tmp_path: Path, models: Path, datas: list[Path]
) -> None:
    """Break 15: three data directories, one key, room for one: three engines ran."""
    ledger = tmp_path / "shared-ledger.db"
    key = KEYS[:1]
    config = write_config(tmp_path / "one.toml", key, ledger, models)
    # What one engine costs here (reserved, then measured), on a ledger of its own.
    probe_ledger = tmp_path / "probe-ledger.db"
    price, footprint = first_launch_costs(
        write_config(tmp_path / "probe.toml", key, probe_ledger, models),
        tmp_path / "probe-data",
        probe_ledger,
        key[0],
    )
    one = room_for(1, price, footprint)
    budget_gib = one / 2**30  # room for one engine, never two
    env = {"HOSTLER_CAPACITY_BUDGET_GB": f"{budget_gib:.6f}"}
    daemons = [
        start_daemon(config, data, tmp_path / f"d{i}.log", env=env) for i, data in enumerate(datas)
    ]
    try:
        wait_for(lambda: all(len(daemon_starts(d)) == 1 for d in datas))
        wait_for(lambda: sum(count(d, key[0], "engine.ready") for d in datas) >= 1)
        time.sleep(1.5)  # let the other two try (and be denied)
        running = [p for d in datas for p in token_holders(prefix_of(d))]
        assert len(running) == 1, [p.pid for p in running]
        state = ledger_state(ledger)
        assert len(state.reservations) == 1
        assert state.committed <= budget_gib * 2**30
        with EventStore.open(ledger) as store:
            denied = [r for r in store.read_stream(LEDGER_STREAM) if r.type == "ledger.denied"]
        assert len(denied) >= 2  # the two others asked and were refused, with the inputs
        assert all(d.payload["key"] == key[0] for d in denied)
    finally:
        for daemon in daemons:
            daemon.send_signal(signal.SIGTERM)
        for daemon in daemons:
            daemon.wait(30)
    assert all(token_holders(prefix_of(d)) == [] for d in datas)
    assert ledger_state(ledger).committed == 0


#: Fixed seeds: CI replays the same moments every run.
CHAOS_SEEDS = tuple(range(20))


def test_chaos_sigkill_at_random_moments_leaves_one_owner_per_engine(
    tmp_path: Path, models: Path, datas: list[Path]
) -> None:
    """A daemon with two real engines is SIGKILLed at a random moment and restarted, 20 times.

    After each restart settles: no orphan engine, one engine per key, the ledger holds exactly
    one reservation per live engine (owned by the live daemon, paying for that pid), and the
    replayed log matches the process table. A clean SIGTERM at the end leaves nothing.
    """
    data, ledger = datas[0], tmp_path / "ledger.db"
    config = write_config(tmp_path / "chaos.toml", KEYS, ledger, models)
    for seed in CHAOS_SEEDS:
        delay = random.Random(seed).uniform(0.0, 1.5)  # noqa: S311 - a test's schedule
        doomed = start_daemon(config, data, tmp_path / "chaos.log")
        time.sleep(delay)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        starts = len(daemon_starts(data))
        survivor = start_daemon(config, data, tmp_path / "chaos.log")
        try:
            wait_for(lambda n=starts: len(daemon_starts(data)) == n + 1, timeout=60)
            wait_for(lambda: _settled(data), timeout=60)
            _check_one_owner(data, ledger, survivor, seed)
        finally:
            survivor.send_signal(signal.SIGKILL)  # the next round adopts from a SIGKILL too
            survivor.wait(10)
    starts = len(daemon_starts(data))
    final = start_daemon(config, data, tmp_path / "chaos.log")
    try:
        wait_for(lambda: len(daemon_starts(data)) == starts + 1, timeout=60)
        wait_for(lambda: _settled(data), timeout=60)
    finally:
        final.send_signal(signal.SIGTERM)
        final.wait(30)
    assert token_holders(prefix_of(data)) == []
    assert ledger_state(ledger).committed == 0


def _settled(data: Path) -> bool:
    with EventStore.open(data / "events.db") as store:
        world = replay(store)
    return all(
        key in world.engines
        and world.engines[key].state == "running"
        and alive(world.engines[key].pid)
        for key in KEYS
    )


def _check_one_owner(data: Path, ledger: Path, daemon: subprocess.Popen[bytes], seed: int) -> None:
    with EventStore.open(data / "events.db") as store:
        world = replay(store)
    logged = {key: world.engines[key].pid for key in KEYS}
    live = {p.pid for p in token_holders(prefix_of(data))}
    assert live == set(logged.values()), f"seed {seed}: log {logged} vs processes {live}"
    state = ledger_state(ledger)
    held = sorted(state.reservations.values(), key=lambda h: h.key)
    assert [h.key for h in held] == sorted(KEYS), f"seed {seed}: {held}"
    for h in held:
        assert h.owner.split(":")[1] == str(daemon.pid), f"seed {seed}: {h.owner}"
        assert h.pid == logged[h.key], f"seed {seed}: {h} pays for another process"


def test_a_copy_with_its_own_ledger_never_takes_a_live_daemons_engine(
    tmp_path: Path, models: Path, datas: list[Path]
) -> None:
    """Break (issue 19): a copy of a live daemon's data directory, started with another ledger
    and a config without the engine, adopted that engine and stopped it as unconfigured. Only
    a shared ledger told it the engine was another daemon's; the log itself names that daemon.
    """
    original, copy = datas[0], datas[1]
    config = write_config(tmp_path / "a.toml", KEYS[:1], tmp_path / "ledger.db", models)
    other = write_config(tmp_path / "b.toml", KEYS[1:], tmp_path / "other-ledger.db", models)
    first = start_daemon(config, original, tmp_path / "d1.log")
    second = None
    try:
        wait_for(lambda: count(original, KEYS[0], "engine.ready") == 1)
        with EventStore.open(original / "events.db") as store:
            pid = replay(store).engines[KEYS[0]].pid
        shutil.copytree(original, copy, ignore=shutil.ignore_patterns("*.lock"))
        second = start_daemon(other, copy, tmp_path / "d2.log")
        wait_for(lambda: len(daemon_starts(copy)) == 2)  # the copied start + its own
        started = daemon_starts(copy)[-1]
        assert started["adopted"] == [] and started["reaped"] == []
        lost = [p for s, t, p in events(copy) if s == f"engine/{KEYS[0]}" and t == "engine.lost"]
        assert f"pid {pid} belongs to the daemon this log was copied from" in lost[-1]["cause"]
        assert not any(
            t == "engine.stop_requested" for s, t, _ in events(copy) if s == f"engine/{KEYS[0]}"
        )
        assert alive(pid)
        second.send_signal(signal.SIGTERM)
        second.wait(30)
        assert alive(pid)  # the copy's shutdown stopped only what it started
    finally:
        for daemon in (first, second):
            if daemon is not None and daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(30)
    assert not alive(pid)


def test_a_copied_data_directory_never_takes_a_live_daemons_engine(
    tmp_path: Path, models: Path, datas: list[Path]
) -> None:
    """A copy of a running daemon's data directory adopted its engine, then killed it."""
    original, copy, ledger = datas[0], datas[1], tmp_path / "ledger.db"
    config = write_config(tmp_path / "a.toml", KEYS[:1], ledger, models)
    first = start_daemon(config, original, tmp_path / "d1.log")
    second = None
    try:
        wait_for(lambda: count(original, KEYS[0], "engine.ready") == 1)
        with EventStore.open(original / "events.db") as store:
            pid = replay(store).engines[KEYS[0]].pid
        shutil.copytree(original, copy, ignore=shutil.ignore_patterns("*.lock"))
        second = start_daemon(config, copy, tmp_path / "d2.log")
        wait_for(lambda: len(daemon_starts(copy)) == 2)  # the copied start + its own
        started = daemon_starts(copy)[-1]
        assert started["adopted"] == [] and started["reaped"] == []
        lost = [p for s, t, p in events(copy) if s == f"engine/{KEYS[0]}" and t == "engine.lost"]
        assert "held by another live daemon" in lost[-1]["cause"]
        assert alive(pid)
        # the original still owns its reservation; the copy runs its own engine beside it
        wait_for(lambda: count(copy, KEYS[0], "engine.ready") == 2)
        owners = {h.owner.split(":")[1] for h in ledger_state(ledger).reservations.values()}
        assert owners == {str(first.pid), str(second.pid)}
        second.send_signal(signal.SIGTERM)
        second.wait(30)
        assert alive(pid)  # the copy's shutdown stopped only its own engine
    finally:
        for daemon in (first, second):
            if daemon is not None and daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(30)
    assert not alive(pid)
