"""The process seam: how a supervisor runs, watches and stops its engine's process.

A supervisor never touches ``subprocess``, pids or signals itself: it asks a
:class:`ProcessRunner` to spawn an engine or to take over one an earlier daemon left running
(adoption), and holds the :class:`EngineProcess` it gets back for the engine's life — whether it
still runs, how it exited, and its stop (TERM, TERM, KILL to its group, the identity re-checked
before each signal: SG4). The real runner is :data:`OS_RUNNER` (:class:`OsRunner`, over
:mod:`hostler.engines.process`); :class:`hostler.testing.FakeRunner` stands in for it in tests
(tox's ``Execute``, llama-swap's ``Process``: one small interface, two implementations).
"""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hostler.capacity.ledger import Held
from hostler.clock import Clock
from hostler.drivers.host_ledger import engine_alive
from hostler.engines.process import (
    Pidfd,
    ProcessIdentity,
    Termination,
    leader_alive,
    open_verified,
    spawn_engine,
    terminate_group,
)

__all__ = ["OS_RUNNER", "EngineProcess", "ExitStatus", "OsProcess", "OsRunner", "ProcessRunner"]


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a process this daemon spawned exited: its code, or the signal that ended it."""

    code: int | None
    signal: int | None

    def describe(self) -> str:
        """``exit code 1``, ``signal 9``."""
        if self.signal is not None:
            return f"signal {self.signal}"
        return f"exit code {self.code}" if self.code is not None else "exit status unknown"


class EngineProcess(ABC):
    """One engine process, spawned or adopted; held by its supervisor for the engine's life.

    Attributes:
        identity: Who it is (pid, start time, boot, launch token, argv fingerprint, port).
    """

    identity: ProcessIdentity

    @property
    @abstractmethod
    def own(self) -> bool:
        """Whether this daemon spawned it (so its exit status can be known)."""

    @abstractmethod
    def exit_status(self) -> ExitStatus | None:
        """How it exited; None while it runs, and always for an adopted one (not our child)."""

    @abstractmethod
    def alive(self) -> bool:
        """Whether its leader still runs; a pid now another process's reads as dead (SG4)."""

    @abstractmethod
    async def terminate(
        self, *, grace: float, second_grace: float, kill_wait: float, clock: Clock
    ) -> Termination:
        """TERM, TERM, KILL its group and say whether it is gone (never signalling a stranger)."""

    @abstractmethod
    def close(self) -> None:
        """Let go of it (its pidfd): it is not this supervisor's to watch any more."""


class ProcessRunner(ABC):
    """Spawns engine processes and takes over running ones."""

    @abstractmethod
    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        log_path: Path,
        launch_token: str,
        port: int,
        cwd: Path | None,
    ) -> EngineProcess:
        """Start an engine in its own session, its output appended to ``log_path``.

        Raises:
            EngineStartError: The log path is not a regular file it can open.
            OSError: The executable could not be started.
            ValueError: A NUL in the argv or the environment.
        """

    @abstractmethod
    def holds(self, held: Held) -> bool:
        """Whether the process a ledger reservation names still runs (the ledger's OW2 question)."""

    @abstractmethod
    def adopt(self, identity: ProcessIdentity, pidfd: Pidfd | None = None) -> EngineProcess:
        """Hold a live process an earlier daemon started (its identity already checked).

        ``pidfd`` is one opened before the identity was checked; without one, it is opened
        here and the identity checked again (a process that no longer matches is held without
        one, reads as dead and is never signalled).
        """


class OsProcess(EngineProcess):
    """A real process: our unreaped child (``popen``), or an adopted one (``popen`` None).

    Attributes:
        popen: The child, when this daemon spawned it.
        pidfd: The pidfd held since spawn or adoption (SG4).
    """

    def __init__(
        self, identity: ProcessIdentity, popen: subprocess.Popen[bytes] | None, pidfd: Pidfd
    ) -> None:
        self.identity = identity
        self.popen = popen
        self.pidfd = pidfd

    @property
    def own(self) -> bool:
        """Whether it is our child."""
        return self.popen is not None

    def exit_status(self) -> ExitStatus | None:
        """The child's exit (reaped now if it has ended); None while it runs or if adopted."""
        if self.popen is None:
            return None
        code = self.popen.poll()
        if code is None:
            return None
        return ExitStatus(None, -code) if code < 0 else ExitStatus(code, None)

    def alive(self) -> bool:
        """Our child: not exited; adopted: its leader, through the pidfd or its identity."""
        if self.popen is not None:
            return self.popen.poll() is None
        return leader_alive(self.identity, self.pidfd)

    async def terminate(
        self, *, grace: float, second_grace: float, kill_wait: float, clock: Clock
    ) -> Termination:
        """:func:`hostler.engines.process.terminate_group` on its group."""
        return await terminate_group(
            self.identity.pid,
            identity=self.identity,
            child=self.popen,
            pidfd=self.pidfd,
            grace=grace,
            second_grace=second_grace,
            kill_wait=kill_wait,
            clock=clock,
        )

    def close(self) -> None:
        """Close the pidfd."""
        self.pidfd.close()


class OsRunner(ProcessRunner):
    """Real processes (:func:`hostler.engines.process.spawn_engine`, pidfds, process groups)."""

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        log_path: Path,
        launch_token: str,
        port: int,
        cwd: Path | None,
    ) -> OsProcess:
        """Spawn it in a new session, a pidfd opened on it at once."""
        popen, identity, pidfd = spawn_engine(
            argv, env, log_path=log_path, launch_token=launch_token, port=port, cwd=cwd
        )
        return OsProcess(identity, popen, pidfd)

    def holds(self, held: Held) -> bool:
        """:func:`hostler.drivers.host_ledger.engine_alive`: by pid and start time, or token."""
        return engine_alive(held)

    def adopt(self, identity: ProcessIdentity, pidfd: Pidfd | None = None) -> OsProcess:
        """Hold it through ``pidfd``, or one opened (and the identity re-checked) now."""
        if pidfd is None:
            pidfd, _why = open_verified(identity)
        return OsProcess(identity, None, pidfd)


#: The runner of real processes: every supervisor's unless one is handed in.
OS_RUNNER = OsRunner()
