"""In-memory engine processes and their HTTP, behind the supervisor's real seams.

:class:`FakeRunner` is a :class:`~hostler.engines.runner.ProcessRunner` whose processes exist
only in memory; :class:`FakeTransport` is an :class:`~hostler.engines.http.EngineTransport`
that answers for them. Handed to a :class:`~hostler.engines.supervisor.Supervisor` with a
:class:`~hostler.testing.clock.VirtualClock`, a test runs starts, readiness waits, crashes,
stops and their escalation, health strikes and idle stops in virtual time, in milliseconds,
without a process or a socket (httpx's ``MockTransport``, tox's ``Execute``). What only a real
engine can prove (argv, real readiness, adoption across daemons, memory) stays with the real
``llama-server`` and :mod:`hostler.testing.fake_engine`.

A process becomes ready ``ready_after`` seconds of the clock after its spawn (None: never);
:meth:`FakeProcess.crash` ends it, :meth:`FakeProcess.log` writes a line to its log file (the
supervisor reads the real file), and ``ignores_term`` / ``unkillable`` script a stop that
needs a second TERM or that not even KILL ends.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hostler.capacity.ledger import Held
from hostler.clock import Clock
from hostler.engines.http import EngineTransport, Probe, probe_path_problem
from hostler.engines.process import (
    Pidfd,
    ProcessIdentity,
    Termination,
    argv_fingerprint,
    run_stop,
)
from hostler.engines.runner import EngineProcess, ExitStatus, ProcessRunner
from hostler.machines.stop import StopTimings

__all__ = ["FAKE_PID_BASE", "FakeProcess", "FakeRunner", "FakeTransport"]

#: Fake pids start above any kernel's pid_max (2**22), so none is ever a real process's.
FAKE_PID_BASE = 10_000_000


class FakeProcess(EngineProcess):
    """One in-memory engine process.

    Args:
        identity: Who it is.
        own: Spawned by the runner (else adopted: no exit status).
        clock: The clock its readiness is measured on.
        ready_after: Seconds after its making until it answers ready (None: never).
        log_path: Its log file (None: it writes none).
        ignores_term: How many TERMs it lives through.
        unkillable: No signal ends it, not even KILL (a group stuck in the kernel).
    """

    def __init__(
        self,
        identity: ProcessIdentity,
        *,
        own: bool,
        clock: Clock,
        ready_after: float | None,
        log_path: Path | None = None,
        ignores_term: int = 0,
        unkillable: bool = False,
    ) -> None:
        self.identity = identity
        self._own = own
        self._clock = clock
        self.made_at = clock.monotonic()
        self.ready_after = ready_after
        self.log_path = log_path
        self.ignores_term = ignores_term
        self.unkillable = unkillable
        #: How it ended (None: it runs).
        self.ended: ExitStatus | None = None
        #: The signals it was sent, in order.
        self.signals: list[int] = []
        self.closed = False

    @property
    def own(self) -> bool:
        """Whether the runner spawned it."""
        return self._own

    @property
    def ready(self) -> bool:
        """Whether it answers its readiness path as ready now."""
        if self.ended is not None or self.ready_after is None:
            return False
        return self._clock.monotonic() - self.made_at >= self.ready_after

    def exit_status(self) -> ExitStatus | None:
        """How it ended, for a spawned one."""
        return self.ended if self._own else None

    def alive(self) -> bool:
        """Whether it has not ended."""
        return self.ended is None

    def crash(self, *, signum: int | None = signal.SIGKILL, code: int | None = None) -> None:
        """End it unasked: killed by ``signum``, or exited with ``code``."""
        self.ended = ExitStatus(code, None) if code is not None else ExitStatus(None, signum)

    def log(self, line: str) -> None:
        """Append ``line`` to its log file, as the engine would print it."""
        if self.log_path is None:
            raise ValueError("this fake process has no log file")
        with self.log_path.open("a", encoding="utf-8") as out:
            out.write(line.rstrip("\n") + "\n")

    async def terminate(
        self, *, grace: float, second_grace: float, kill_wait: float, clock: Clock
    ) -> Termination:
        """TERM (``grace``), TERM (``second_grace``), KILL (``kill_wait``), on ``clock``.

        The same escalation the real runner carries out (:func:`~hostler.engines.process.
        run_stop`); only the process's answers to the signals are scripted here.
        """
        timings = StopTimings(grace, second_grace, kill_wait)
        ended = await run_stop(self, self.identity.pid, timings, clock)
        if not ended.gone:
            return Termination(None, None, False, ended.detail)
        return self._termination()

    async def signal_if_ours(self, signum: int) -> tuple[bool, str]:
        """Take ``signum`` as this process's script says; a process that ended takes none."""
        if self.ended is not None:
            return False, ""
        self.signals.append(signum)
        if self.unkillable:
            pass  # stuck in the kernel: no signal ends it
        elif signum == signal.SIGTERM and self.ignores_term <= 0:
            self.ended = ExitStatus(None, signal.SIGTERM)
        elif signum == signal.SIGTERM:
            self.ignores_term -= 1
        else:
            self.ended = ExitStatus(None, signal.SIGKILL)
        return True, ""

    def gone(self) -> bool:
        """Whether it has ended."""
        return self.ended is not None

    async def still_ours(self) -> tuple[bool, str]:
        """A fake process is always its engine's own."""
        return True, ""

    def _termination(self) -> Termination:
        status = self.exit_status()
        return Termination(
            status.code if status else None, status.signal if status else None, gone=True
        )

    def close(self) -> None:
        """Mark it let go of."""
        self.closed = True


class FakeRunner(ProcessRunner):
    """Spawns :class:`FakeProcess` objects.

    Args:
        clock: The clock the processes' readiness is measured on (the supervisor's).
        ready_after: Each new process's :attr:`FakeProcess.ready_after`.
        on_spawn: Called with each new process (to log lines, crash it, script its stop).
        fail_spawn: Raised by every spawn instead (an ``OSError``: the binary is missing).
    """

    def __init__(
        self,
        clock: Clock,
        *,
        ready_after: float | None = 0.0,
        on_spawn: Callable[[FakeProcess], None] | None = None,
        fail_spawn: OSError | None = None,
    ) -> None:
        self.clock = clock
        self.ready_after = ready_after
        self.on_spawn = on_spawn
        self.fail_spawn = fail_spawn
        #: Every process spawned or adopted, in order.
        self.processes: list[FakeProcess] = []
        #: The argv and environment of each spawn, in order.
        self.launches: list[tuple[tuple[str, ...], dict[str, str]]] = []
        self._pids = itertools.count(FAKE_PID_BASE)

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        log_path: Path,
        launch_token: str,
        port: int,
        cwd: Path | None,
    ) -> FakeProcess:
        """A new live process; its log file created (0600) as a real spawn would."""
        if any("\0" in part for part in (*argv, *env, *env.values())):
            raise ValueError("embedded null byte")
        if self.fail_spawn is not None:
            raise self.fail_spawn
        log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        identity = ProcessIdentity(
            pid=next(self._pids),
            create_time=self.clock.wall(),
            boot_id="fake-boot",
            launch_token=launch_token,
            argv_fingerprint=argv_fingerprint(argv),
            port=port,
        )
        process = FakeProcess(
            identity, own=True, clock=self.clock, ready_after=self.ready_after, log_path=log_path
        )
        self.processes.append(process)
        self.launches.append((tuple(argv), dict(env)))
        if self.on_spawn is not None:
            self.on_spawn(process)
        return process

    def adopt(self, identity: ProcessIdentity, pidfd: Pidfd | None = None) -> FakeProcess:
        """The live process with that pid, as not our child; a dead one if none is known."""
        known = next((p for p in self.processes if p.identity.pid == identity.pid), None)
        adopted = FakeProcess(identity, own=False, clock=self.clock, ready_after=0.0)
        if known is None or known.ended is not None:
            adopted.ended = ExitStatus(None, None)
        self.processes.append(adopted)
        return adopted

    def holds(self, held: Held) -> bool:
        """Whether the process a ledger reservation names still runs (the ledger's question)."""
        return any(p.identity.pid == held.pid and p.own and p.alive() for p in self.processes)

    def on_port(self, port: int) -> FakeProcess | None:
        """The live process listening on ``port``, if any."""
        return next(
            (p for p in reversed(self.processes) if p.identity.port == port and p.alive()), None
        )


class FakeTransport(EngineTransport):
    """Answers probes for a :class:`FakeRunner`'s processes (or through ``handler``).

    By default a live, ready process answers ``200 {"status":"ok"}``, a live one still loading
    ``503``, and a port with no live process nothing (connection refused). ``handler`` replaces
    that: it gets the probe and the process on its port (or None) and returns
    ``(status, body)`` or None.
    """

    def __init__(
        self,
        runner: FakeRunner,
        handler: Callable[[Probe, FakeProcess | None], tuple[int, bytes] | None] | None = None,
    ) -> None:
        self.runner = runner
        self.handler = handler
        #: Every probe asked, in order.
        self.probes: list[Probe] = []

    async def probe(
        self, probe: Probe, *, wait: float, clock: Clock, with_body: bool = True
    ) -> tuple[int, bytes] | None:
        """The process's answer, or None; a path that could not be sent raises ValueError."""
        problem = probe_path_problem(probe.path)
        if problem is not None:
            raise ValueError(problem)
        self.probes.append(probe)
        await clock.sleep(0)
        process = self.runner.on_port(probe.port)
        if self.handler is not None:
            return self.handler(probe, process)
        if process is None:
            return None
        if process.ready:
            return 200, b'{"status":"ok"}'
        return 503, b'{"error":{"code":503,"message":"Loading model"}}'
