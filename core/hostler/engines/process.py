"""Engine processes: spawned in their own process group, identified, signalled as a group.

An engine must outlive the daemon that started it (so a restart can adopt it with its warm
cache): it gets its own session, its output goes to a file (no pipes), stdin is closed, and no
``async with process`` ever ties its life to ours. Only processes that carry our launch token
and whose recorded identity still matches are ever signalled (SG4): the check is made
immediately before every signal, and where the kernel offers pidfds (Linux ≥ 5.3) the leader
is held through one from spawn or adoption on, so a pid that was reaped and reused by another
process can never receive a signal meant for the engine.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread
import psutil

from hostler.clock import SYSTEM_CLOCK, Clock
from hostler.errors import EngineStartError
from hostler.machines.stop import (
    CheckGroup,
    GroupChecked,
    GroupLooked,
    LookAtGroup,
    PauseStop,
    SignalGroup,
    Signalled,
    StopEnded,
    StopEscalation,
    StopObservation,
    StopPaused,
    StopTimings,
)
from hostler.probes.host import boot_id, same_start, started_since_boot

__all__ = [
    "LAUNCH_TOKEN_ENV",
    "SHEBANG_WORDS",
    "USE_PIDFD",
    "GroupOps",
    "Pidfd",
    "ProcessIdentity",
    "Termination",
    "argv_fingerprint",
    "cmdline_matches",
    "group_alive",
    "group_is_ours",
    "identity_matches",
    "leader_alive",
    "open_engine_log",
    "open_verified",
    "run_stop",
    "spawn_engine",
    "terminate_group",
    "token_holders",
]

#: The environment variable that marks a process as launched by hostler (and by which daemon).
LAUNCH_TOKEN_ENV = "HOSTLER_LAUNCH_TOKEN"  # noqa: S105 - a variable name, not a secret

#: Use pidfds where the kernel has them. False runs the fallback (identity re-checked before
#: each signal, no pidfd held) as on a kernel without ``pidfd_open``: tests set it.
USE_PIDFD = True

#: How far apart two readings of one process's start time may be (psutil rounds them).
START_TIME_TOLERANCE = 0.05

#: ``pidfd_open`` errors that mean "no pidfds here" (not built in, refused by a sandbox).
_NO_PIDFD = {errno.ENOSYS, errno.EPERM, errno.EACCES, errno.EOPNOTSUPP}


def argv_fingerprint(argv: Sequence[str]) -> str:
    """A stable digest of a command line."""
    digest = hashlib.sha256("\0".join(argv).encode("utf-8", "surrogateescape")).hexdigest()
    return f"sha256:{digest[:32]}"


#: SG6: at most this many leading words the kernel puts before a ``#!`` script's own argv
#: (the interpreter and its one optional argument).
SHEBANG_WORDS = 2


def cmdline_matches(cmdline: Sequence[str], fingerprint: str) -> bool:
    """SG6: whether a process's command line is the launched argv of ``fingerprint``.

    The argv itself, or — when the program was a ``#!`` script — the argv after the
    interpreter the kernel ran it with (one or two leading words).
    """
    return any(
        argv_fingerprint(cmdline[skip:]) == fingerprint
        for skip in range(min(SHEBANG_WORDS, max(len(cmdline) - 1, 0)) + 1)
    )


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """What makes an engine process recognisable after a daemon restart.

    ``since_boot`` is its start in the kernel's ticks since boot (None where the kernel does
    not say, or the record predates it): what tells the process apart, since ``create_time``
    moves with the system clock.
    """

    pid: int
    create_time: float
    boot_id: str
    launch_token: str
    argv_fingerprint: str
    port: int
    since_boot: float | None = None

    def spawned_facts(self) -> dict[str, object]:
        """The fields of its ``engine.spawned`` record (what a later daemon adopts it by)."""
        return {
            "pid": self.pid,
            "create_time": self.create_time,
            "boot_id": self.boot_id,
            "launch_token": self.launch_token,
            "argv_fingerprint": self.argv_fingerprint,
            "port": self.port,
            "since_boot": self.since_boot,
        }


class Pidfd:
    """A pidfd on one process, held for that process's life (SG4).

    A pidfd names the process it was opened on, never a pid number: once that process is
    reaped, signalling through it fails with :class:`ProcessLookupError` instead of reaching
    whatever process gets the number next. ``fd`` is None where no pidfd could be had (the
    kernel has none, :data:`USE_PIDFD` is off, or the process it was meant for was not the
    recorded one); the callers then re-check the recorded identity before each signal.
    """

    __slots__ = ("fd", "pid")

    def __init__(self, pid: int, fd: int | None) -> None:
        self.pid = pid
        self.fd = fd

    @classmethod
    def open(cls, pid: int) -> Pidfd:
        """Open a pidfd on ``pid`` (``fd`` None where pidfds are unavailable).

        Raises:
            ProcessLookupError: No process has that pid.
        """
        if not USE_PIDFD:
            return cls(pid, None)
        try:
            fd = os.pidfd_open(pid)
        except AttributeError:  # a Python or platform without it
            return cls(pid, None)
        except ProcessLookupError:
            raise
        except OSError as exc:
            if exc.errno in _NO_PIDFD:
                return cls(pid, None)
            raise
        os.set_inheritable(fd, False)
        return cls(pid, fd)

    @property
    def held(self) -> bool:
        """Whether a pidfd is open."""
        return self.fd is not None

    def alive(self) -> bool | None:
        """Whether the process it names still exists (a zombie counts: its pid is still held).

        None when there is no pidfd to ask, or the kernel refuses the question.
        """
        if self.fd is None:
            return None
        try:
            signal.pidfd_send_signal(self.fd, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # it exists; we may not signal it (never the case for our engines)
        except OSError:
            return None
        return True

    def close(self) -> None:
        """Close the pidfd (idempotent)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __repr__(self) -> str:
        return f"Pidfd(pid={self.pid}, fd={self.fd})"


def open_engine_log(path: Path) -> int:
    """Open an engine's log for appending: a regular file of ours, made 0600, never blocking.

    A symlink is not followed (it could point at a file of someone else's, which rotation
    would truncate), and a FIFO or device is refused without waiting on it (a FIFO's open
    blocks until a reader comes).

    Raises:
        OSError: Not a regular file (``EINVAL``, naming what it is), a symlink (``ELOOP``), or
            it cannot be opened.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(path, flags, 0o600)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    try:
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o600:
            os.fchmod(fd, 0o600)  # a log left with a looser mode is tightened
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        raise
    return fd


def spawn_engine(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    log_path: Path,
    launch_token: str,
    port: int,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], ProcessIdentity, Pidfd]:
    """Start an engine in a new session, output appended to ``log_path``.

    The log is opened ``O_APPEND``, so the copy-then-truncate rotation
    (:func:`hostler.engines.logs.rotate_log`) leaves the engine writing at the new end. A
    pidfd on the child is opened at once (it is our unreaped child: its pid cannot have been
    reused); the caller holds it for the engine's life and closes it.

    Raises:
        EngineStartError: The log path is not a regular file we can open.
        OSError: The executable could not be started (missing, not executable).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    full_env = {**os.environ, **env, LAUNCH_TOKEN_ENV: launch_token}
    try:
        fd = open_engine_log(log_path)
    except OSError as exc:
        raise EngineStartError(
            f"{log_path}: cannot open the engine log ({exc.strerror or exc}); remove whatever "
            "is in its place"
        ) from exc
    with os.fdopen(fd, "ab") as log:
        process = subprocess.Popen(  # noqa: S603 - argv built by the adapter, no shell
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=full_env,
            cwd=cwd,
            close_fds=True,
        )
    try:
        pidfd = Pidfd.open(process.pid)
    except OSError:
        pidfd = Pidfd(process.pid, None)
    try:
        created = psutil.Process(process.pid).create_time()
    except psutil.NoSuchProcess:
        created = time.time()
    identity = ProcessIdentity(
        pid=process.pid,
        create_time=created,
        boot_id=boot_id(),
        launch_token=launch_token,
        argv_fingerprint=argv_fingerprint(argv),
        port=port,
        since_boot=started_since_boot(process.pid),
    )
    return process, identity, pidfd


def identity_matches(identity: ProcessIdentity) -> tuple[bool, str]:  # noqa: PLR0911
    """Whether the recorded process is still that process (same boot, pid, start, token, argv).

    Returns ``(matches, why_not)``.
    """
    if identity.boot_id != boot_id():
        return False, "the machine rebooted since"
    try:
        process = psutil.Process(identity.pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False, f"pid {identity.pid} has exited"
        if not same_start(
            process,
            wall=identity.create_time,
            since_boot=identity.since_boot,
            tolerance=START_TIME_TOLERANCE,
        ):
            return False, f"pid {identity.pid} is now another process"
        token = process.environ().get(LAUNCH_TOKEN_ENV)
        if token != identity.launch_token:
            return False, f"pid {identity.pid} does not carry the recorded launch token"
        if not cmdline_matches(process.cmdline(), identity.argv_fingerprint):
            return False, f"pid {identity.pid} runs another command line"
    except psutil.NoSuchProcess:
        return False, f"pid {identity.pid} has exited"
    except psutil.AccessDenied:
        return False, f"pid {identity.pid} cannot be inspected (access denied)"
    return True, ""


def open_verified(identity: ProcessIdentity) -> tuple[Pidfd, str]:
    """A pidfd on the recorded process, and why it is not that process ("" when it is).

    The pidfd is opened *before* the identity is checked: a process that matches the recorded
    start time afterwards was already running when the pidfd was opened, so the pidfd names
    it and no later reuse of the pid can redirect it. When the identity does not match, the
    pidfd is closed (``fd`` None) and every later check re-reads the identity, which fails.
    Reads ``/proc``: call it off the event loop.
    """
    try:
        pidfd = Pidfd.open(identity.pid)
    except ProcessLookupError:
        return Pidfd(identity.pid, None), f"pid {identity.pid} has exited"
    except OSError:  # out of descriptors, say: fall back to re-checking the identity
        pidfd = Pidfd(identity.pid, None)
    matches, why = identity_matches(identity)
    if not matches:
        pidfd.close()
        return pidfd, why
    return pidfd, ""


def leader_alive(identity: ProcessIdentity, pidfd: Pidfd | None = None) -> bool:
    """Whether the recorded leader still runs (not a zombie, not another process on its pid).

    Through the pidfd when one is held; otherwise the whole recorded identity is re-read
    (start time, launch token, command line), so a reused pid reads as dead, never as the
    engine — even one that started within the start time's resolution of the engine.
    """
    known = pidfd.alive() if pidfd is not None else None
    if known is None:
        return identity_matches(identity)[0]
    if not known:
        return False
    try:
        return bool(psutil.Process(identity.pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def token_holders(accept: Callable[[str], bool]) -> Iterator[tuple[psutil.Process, str]]:
    """Live processes whose launch token ``accept`` takes, each with its token.

    A scan of the process table: call it off the event loop. Processes that vanish or hide
    their environment are skipped.
    """
    for process in psutil.process_iter():
        try:
            token = process.environ().get(LAUNCH_TOKEN_ENV, "")
            if token and accept(token) and process.status() != psutil.STATUS_ZOMBIE:
                yield process, token
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (whoever's it is: see :func:`group_is_ours`)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_is_ours(
    pgid: int,
    identity: ProcessIdentity,
    *,
    child: subprocess.Popen[bytes] | None = None,
    pidfd: Pidfd | None = None,
) -> tuple[bool, str]:
    """Whether process group ``pgid`` is still the engine's, and why not (SG4).

    Its leader is ours when the pidfd held since spawn or adoption still reaches it (the pid,
    and so the group id, cannot have been reused while it exists), when it is our own child
    not yet reaped, or, without either, when its recorded identity still matches. A group
    whose leader is gone is ours only while every live member carries the engine's launch
    token (an engine's children inherit it); any other process in it means the group id now
    belongs to someone else. Scans the process table in that last case: call it off the loop.

    ``why`` is empty when the group is simply gone and its pid unused (nothing to say); it
    names what the pid or the group is now otherwise.
    """
    alive = pidfd.alive() if pidfd is not None else None
    if alive:
        return True, ""
    if alive is None:
        if child is not None and child.returncode is None:
            return True, ""  # not reaped yet: nobody else can have its pid
        matches, why = identity_matches(identity)
        if matches:
            return True, ""
    else:
        why = f"pid {identity.pid} has exited"
    if not group_alive(pgid):
        return False, why if _taken(identity.pid) else ""
    return _members_carry(pgid, identity.launch_token, why)


def _taken(pid: int) -> bool:
    """Whether a live process has ``pid`` (one that may not be the engine any more)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _members_carry(pgid: int, token: str, leader: str) -> tuple[bool, str]:
    """Whether every live member of a leaderless group carries ``token``."""
    members = 0
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) != pgid or process.status() == psutil.STATUS_ZOMBIE:
                continue
            members += 1
            if process.environ().get(LAUNCH_TOKEN_ENV) != token:
                return False, (
                    f"{leader}; process group {pgid} now holds pid {process.pid}, "
                    "which does not carry the engine's launch token"
                )
        except (OSError, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            return False, f"{leader}; process group {pgid} holds a process hostler cannot inspect"
    if members == 0:
        return False, leader if _taken(pgid) else ""
    return True, ""


def _signal_if_ours(
    pgid: int,
    signum: int,
    identity: ProcessIdentity,
    child: subprocess.Popen[bytes] | None,
    pidfd: Pidfd | None,
) -> tuple[bool, str]:
    """Check the group (SG4), then signal it; whether it did, and why not."""
    ours, why = group_is_ours(pgid, identity, child=child, pidfd=pidfd)
    if not ours:
        return False, why
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)
    return True, ""


@dataclass(frozen=True, slots=True)
class Termination:
    """How a stop ended: the leader's exit (when it was our child) and whether the group is gone.

    ``gone`` False means the group outlived TERM, TERM and KILL: the caller must keep what it
    holds for it (its reservation) and say so. ``detail`` says why a group counted as gone
    without being signalled (it was not the engine's any more).
    """

    exit_code: int | None
    signal: int | None
    gone: bool
    detail: str = ""


class GroupOps(Protocol):
    """What carrying out a :class:`~hostler.machines.stop.StopEscalation` needs of a group."""

    async def signal_if_ours(self, signum: int) -> tuple[bool, str]:
        """Re-check the group, then signal it; whether it did, and why not (SG4)."""

    def gone(self) -> bool:
        """Whether the group is gone (our own child reaped first)."""

    async def still_ours(self) -> tuple[bool, str]:
        """Whether the group is still the engine's, and why not (SG4)."""


async def run_stop(ops: GroupOps, group: int, timings: StopTimings, clock: Clock) -> StopEnded:
    """Carry out one stop's escalation (:class:`~hostler.machines.stop.StopEscalation`)."""
    escalation = StopEscalation(group, timings)
    effects = escalation.start()
    while True:
        seen: StopObservation
        match effects[0]:
            case StopEnded() as ended:
                return ended
            case SignalGroup(kill):
                sent, why = await ops.signal_if_ours(signal.SIGKILL if kill else signal.SIGTERM)
                seen = Signalled(sent, why)
            case LookAtGroup():
                seen = GroupLooked(ops.gone())
            case PauseStop(seconds):
                await clock.sleep(seconds)
                seen = StopPaused()
            case CheckGroup():
                ours, why = await ops.still_ours()
                seen = GroupChecked(ours, why)
        effects = escalation.handle(seen, clock.monotonic())


@dataclass(frozen=True, slots=True)
class _OsGroup:
    """A real process group, checked through its pidfd, unreaped child or identity."""

    pgid: int
    identity: ProcessIdentity
    child: subprocess.Popen[bytes] | None
    pidfd: Pidfd | None

    async def signal_if_ours(self, signum: int) -> tuple[bool, str]:
        if self.child is not None:
            self.child.poll()
        return await anyio.to_thread.run_sync(
            _signal_if_ours, self.pgid, signum, self.identity, self.child, self.pidfd
        )

    def gone(self) -> bool:
        if self.child is not None:
            self.child.poll()
        return not group_alive(self.pgid)

    async def still_ours(self) -> tuple[bool, str]:
        return await anyio.to_thread.run_sync(
            lambda: group_is_ours(self.pgid, self.identity, child=self.child, pidfd=self.pidfd)
        )


async def terminate_group(
    pgid: int,
    *,
    identity: ProcessIdentity,
    child: subprocess.Popen[bytes] | None = None,
    pidfd: Pidfd | None = None,
    grace: float = 2.0,
    second_grace: float = 1.0,
    kill_wait: float = 5.0,
    clock: Clock = SYSTEM_CLOCK,
) -> Termination:
    """Stop a process group and verify it is gone.

    TERM the group and wait ``grace``; TERM again (llama-server hangs on the first one while a
    request is in flight, and ends at the second), wait ``second_grace``; then KILL and wait
    ``kill_wait`` (:class:`~hostler.machines.stop.StopEscalation`). Immediately before every
    signal the group is re-checked (:func:`group_is_ours`: the pidfd, the unreaped child or the
    recorded identity, the launch token of a leaderless group's members): a group that is not
    the engine's any more is never signalled, and counts as gone, with why in ``detail`` when
    its pid or group id now names another process (SG4).
    """
    timings = StopTimings(grace, second_grace, kill_wait)
    ended = await run_stop(_OsGroup(pgid, identity, child, pidfd), pgid, timings, clock)
    return _status(child, gone=ended.gone, detail=ended.detail)


def _status(child: subprocess.Popen[bytes] | None, *, gone: bool, detail: str = "") -> Termination:
    if child is None or child.returncode is None:
        return Termination(None, None, gone, detail)
    code = child.returncode
    if code < 0:
        return Termination(None, -code, gone, detail)
    return Termination(code, None, gone, detail)
