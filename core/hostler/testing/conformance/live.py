"""The adapter conformance suite's live checks: the engine under hostler's real supervisor.

Started, probed for readiness, asked for a completion, stopped, and adopted by a fresh
supervisor after a simulated daemon restart: a real process with a real event log and ledger.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import psutil

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.process import token_holders
from hostler.engines.reconcile import reconcile
from hostler.engines.runner import OsProcess
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.events.calibration import CALIBRATION_STREAM, FootprintMeasured
from hostler.machines.engine import Engine
from hostler.plugin import EngineAdapter, LaunchSpec, SessionCache
from hostler.replay import load
from hostler.store.log import EventStore
from hostler.testing.conformance.settings import ConformanceSettings
from hostler.testing.harness import HOST_MEMORY

__all__ = ["Live", "LiveChecks", "http_json"]


class Live:
    """One live engine under the real supervisor, for the ``test_live_*`` checks.

    Args:
        suite: The conformance test (its settings).
        adapter: The adapter under test.
        model: The model to launch.
        options: The launch spec's ``options``.
        folder: A private directory (the data directory).
        slots: The launch spec's ``slots``.
    """

    def __init__(
        self,
        suite: ConformanceSettings,
        adapter: EngineAdapter,
        model: Path,
        options: dict[str, object],
        folder: Path,
        *,
        slots: int = 1,
    ) -> None:
        self.suite = suite
        self.adapter = adapter
        self.model = model
        self.options = options
        self.folder = folder
        self.slots = slots
        self.key = f"{adapter.engine_type}:conformance:0"
        self.token_prefix = f"hostler-conformance-{os.getpid()}-{folder.name}"
        self.store = EventStore.open(folder / "events.db", owner=True)
        self.ledger = HostLedger(
            self.store,
            OwnerIdentity.current("hostler-conformance"),
            lambda: compute_budget(HostMemory(HOST_MEMORY)),
        )

    def spec(self, port: int) -> LaunchSpec:
        """The launch spec of the live engine on ``port``."""
        work = self.folder / "run" / "work"
        return self.suite.launch_spec(
            self.model, port, self.options, key=self.key, work_dir=work, slots=self.slots
        )

    def estimate(self) -> int:
        """The adapter's raw estimate of the launch: what the ledger reserves for its start."""
        return self.adapter.estimate_footprint(self.adapter.read_geometry(self.model), self.spec(0))

    def supervisor(self) -> Supervisor:
        """A fresh supervisor of the live engine's key (as a restarted daemon makes one)."""
        return Supervisor(
            self.key,
            self.adapter,
            self.spec,
            self.store,
            run_dir=self.folder / "run",
            token_prefix=self.token_prefix,
            policy=SupervisorPolicy(
                startup_timeout=self.suite.startup_timeout,
                watch_interval=0.05,
                idle_timeout=0,
                stop_grace=self.suite.stop_grace,
            ),
            ledger=self.ledger,
            footprint=self.estimate,
        )

    def engine_pids(self) -> list[int]:
        """Live processes carrying this suite's launch tokens."""
        prefix = f"{self.token_prefix}:"
        return [p.pid for p, _ in token_holders(lambda token: token.startswith(prefix))]

    def reservations(self) -> list[str]:
        """The keys the ledger holds bytes for."""
        return [str(held["key"]) for held in self.ledger.snapshot()["by_key"]]

    def measured(self) -> list[int]:
        """The footprints hostler measured of the engine's ready launches (bytes), in order."""
        records = self.store.read_stream(CALIBRATION_STREAM)
        events = [r.event for r in records if isinstance(r.event, FootprintMeasured)]
        return [e.measured for e in events if e.engine_key == self.key]

    def events(self) -> list[str]:
        """The engine's recorded event types, in order."""
        return [r.type for r in self.store.read_stream(f"engine/{self.key}")]

    def close(self) -> None:
        """Kill whatever the suite started that is still alive, and close the log."""
        for pid in self.engine_pids():
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        self.store.close()


def http_json(port: int, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    """``(status, body)`` of ``GET path`` on the engine, or ``POST`` of ``body`` as JSON."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:  # noqa: S310 - loopback
            return int(reply.status), reply.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


class LiveChecks(ConformanceSettings):
    """The ``test_live_*`` checks, each on the ``live`` rig of its test."""

    def test_live_start_serve_stop(self, live: Live) -> None:
        """Started, ready by its own readiness rule, serving, then stopped with its group.

        The reservation is held while it runs and released once it is gone.
        """
        anyio.run(self._start_serve_stop, live)

    async def _start_serve_stop(self, live: Live) -> None:
        sup = live.supervisor()
        port = await sup.ensure_running()
        assert sup.state == "running"
        assert live.reservations() == [live.key]
        wide = await anyio.to_thread.run_sync(_listening_beyond_loopback, live.engine_pids())
        assert not wide, f"the engine listens beyond loopback on {', '.join(wide)}: bind 127.0.0.1"
        status, _ = await anyio.to_thread.run_sync(http_json, port, live.adapter.readiness_path)
        assert live.adapter.is_ready(status), f"ready, yet its readiness path answers {status}"
        if self.serves_completions:
            asked = dict(self.completion_body)
            if live.adapter.request_model is not None:  # RD10: as hostler serve forwards it
                asked["model"] = live.adapter.request_model
            status, body = await anyio.to_thread.run_sync(
                http_json, port, self.completion_path, asked
            )
            assert status == 200, f"{self.completion_path} answered {status}: {body[:300]!r}"
            assert json.loads(body).get("choices"), body[:300]
        began = time.monotonic()
        await sup.stop()
        assert time.monotonic() - began < self.stop_grace + 10
        assert sup.state == "stopped"
        assert live.engine_pids() == [], "processes of the engine outlived its stop"
        assert live.reservations() == []
        assert live.events()[-2:] == ["engine.stop_requested", "engine.stopped"]

    def test_live_the_price_covers_the_measured_launch(self, live: Live) -> None:
        """The adapter's estimate is not far below what its ready engine really holds.

        The first launch of a model reserves the raw estimate; hostler measures the ready
        process (RSS, plus the GPU memory NVML gives it) and learns from then on. A measured
        footprint over the estimate by more than ``price_tolerance`` of it (or
        ``price_slack``, whichever allows more) is an estimate that leaves out part of the
        engine (its runtime, an interpreter, a buffer): the ledger held too little meanwhile.
        A price above the measurement is not checked: it is safe, and learning lowers it.
        """
        anyio.run(self._price_covers, live)

    async def _price_covers(self, live: Live) -> None:
        sup = live.supervisor()
        await sup.ensure_running()
        measured = live.measured()
        await sup.stop()
        assert len(measured) == 1, f"hostler measured the ready engine {len(measured)} times"
        estimate = live.estimate()
        allowed = estimate + max(round(estimate * self.price_tolerance), self.price_slack)
        mib = 1024 * 1024
        assert measured[0] <= allowed, (
            f"the ready engine holds {measured[0] / mib:.1f} MiB, its estimate is "
            f"{estimate / mib:.1f} MiB (at most {allowed / mib:.1f} MiB allowed): "
            "estimate_footprint leaves part of the engine out"
        )

    def test_live_a_saved_session_comes_back_after_its_engine_stops(self, live: Live) -> None:
        """CC13/CC14, for an adapter whose cache saves sessions (:class:`SessionCache`).

        A session's turn is prepared (fresh), run, saved to its file (its size told), the
        engine stopped and started again, and the session prepared once more: restored from
        its file (``disk``, tokens told). Its file is then discarded with no engine needed.
        An adapter whose cache saves nothing passes as it is: hostler never asks it.
        """
        anyio.run(self._session_round_trip, live)

    async def _session_round_trip(self, live: Live) -> None:
        sup = live.supervisor()
        port = await sup.ensure_running()
        cache = sup.cache_adapter()
        if not isinstance(cache, SessionCache) or not self.serves_completions:
            await sup.stop()
            return
        session = "conformance-session"
        first = await cache.prepare(session)
        assert first.source == "fresh", f"a session never seen was prepared from {first.source}"
        asked = {**self.completion_body, **first.fields}
        if live.adapter.request_model is not None:
            asked["model"] = live.adapter.request_model
        status, body = await anyio.to_thread.run_sync(http_json, port, self.completion_path, asked)
        assert status == 200, f"{self.completion_path} answered {status}: {body[:300]!r}"
        assert cache.held_sessions() == [session], "the session's turn left it unheld"
        saved = await cache.save_session(session)
        assert not saved.error, saved
        assert saved.tokens > 0, f"a save that wrote a turn's KV told no tokens: {saved}"
        assert saved.bytes > 0, f"a save that wrote a turn's KV told no size: {saved}"
        sizes = await cache.saved_sizes([session, "never-saved"])
        assert set(sizes) == {session}, f"saved_sizes named {sorted(sizes)}, not the one saved"
        assert sizes[session] > 0, sizes
        await sup.stop()
        await sup.ensure_running()
        again = sup.cache_adapter()
        assert isinstance(again, SessionCache), "the next launch has no saving cache"
        assert again is not cache, "one adapter per launch"
        back = await again.prepare(session)
        assert back.source == "disk", f"the saved session came back {back.source}: {back}"
        assert back.restored_tokens > 0, back
        await sup.stop()
        await again.discard([session])  # its engine is gone: the file goes all the same
        assert await again.saved_sizes([session]) == {}

    def test_live_adopted_after_a_daemon_restart(self, live: Live) -> None:
        """A fresh supervisor adopts the running engine (no reload), then stops it."""
        anyio.run(self._adopt, live)

    async def _adopt(self, live: Live) -> None:
        first = live.supervisor()
        await first.ensure_running()
        pid = first.pid
        assert pid is not None
        reaper = _orphan(first)  # the daemon dies here: nothing is stopped, the engine runs on
        engine = load(live.store, Engine, live.key)
        outcomes = await reconcile(
            live.store,
            {live.key: engine},
            token_prefix=live.token_prefix,
            daemon_pid=os.getpid(),
            readiness_path=lambda _key: live.adapter.readiness_path,
            clock=time.time,
        )
        assert [(o.result, o.pid) for o in outcomes] == [("adopted", pid)], outcomes
        second = live.supervisor()
        identity = outcomes[0].identity
        assert identity is not None
        second.adopt(identity, outcomes[0].pidfd)
        assert second.pid == pid
        await second.stop()
        assert live.engine_pids() == [], "the adopted engine outlived its stop"
        assert load(live.store, Engine, live.key).state == "stopped"
        reaper.join(timeout=10)


def _orphan(dead: Supervisor) -> threading.Thread:
    """Reap the dead daemon's engine when it ends, as init does after a real restart.

    Here the engine is this process's child (it would not be a restarted daemon's): a thread
    waits for it, so that it leaves no zombie behind for the adopter to mistake for alive.
    """
    child = getattr(dead, "_child", None)
    proc = getattr(child, "proc", None)
    popen = proc.popen if isinstance(proc, OsProcess) else None  # our child, to be reaped
    reaper = threading.Thread(target=popen.wait if popen else lambda: None, daemon=True)
    reaper.start()
    return reaper


def _listening_beyond_loopback(pids: list[int]) -> list[str]:
    """The addresses the processes (and their children) take requests on that are not loopback.

    A TCP socket counts while it listens; a UDP socket whenever it is bound (it has no listening
    state). ``pids`` are the launch token's holders, so a double-forked child is among them.
    """
    wide: list[str] = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
        for member in family:
            try:
                sockets = member.net_connections(kind="inet")
            except psutil.Error:
                continue
            for conn in sockets:
                ip: object = getattr(conn.laddr, "ip", None)  # an unbound socket has no address
                if not isinstance(ip, str):
                    continue
                if conn.type == socket.SOCK_STREAM and conn.status != psutil.CONN_LISTEN:
                    continue
                if not ipaddress.ip_address(ip.split("%")[0]).is_loopback:
                    wide.append(f"{ip}:{conn.laddr.port}")
    return sorted(set(wide))
