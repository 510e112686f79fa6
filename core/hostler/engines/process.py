"""Engine processes: spawned in their own process group, identified, signalled as a group.

An engine must outlive the daemon that started it (so a restart can adopt it with its warm
cache): it gets its own session, its output goes to a file (no pipes), stdin is closed, and no
``async with process`` ever ties its life to ours. Only processes that carry our launch token
and whose recorded identity still matches are ever signalled.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import psutil

from hostler.probes.host import boot_id

__all__ = [
    "LAUNCH_TOKEN_ENV",
    "ProcessIdentity",
    "Termination",
    "argv_fingerprint",
    "group_alive",
    "identity_matches",
    "spawn_engine",
    "terminate_group",
    "token_holders",
]

#: The environment variable that marks a process as launched by hostler (and by which daemon).
LAUNCH_TOKEN_ENV = "HOSTLER_LAUNCH_TOKEN"  # noqa: S105 - a variable name, not a secret


def argv_fingerprint(argv: Sequence[str]) -> str:
    """A stable digest of a command line."""
    digest = hashlib.sha256("\0".join(argv).encode("utf-8", "surrogateescape")).hexdigest()
    return f"sha256:{digest[:32]}"


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """What makes an engine process recognisable after a daemon restart."""

    pid: int
    create_time: float
    boot_id: str
    launch_token: str
    argv_fingerprint: str
    port: int


def spawn_engine(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    log_path: Path,
    launch_token: str,
    port: int,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    """Start an engine in a new session, output appended to ``log_path``.

    Raises:
        OSError: The executable could not be started (missing, not executable).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    full_env = {**os.environ, **env, LAUNCH_TOKEN_ENV: launch_token}
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
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
    )
    return process, identity


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
        if abs(process.create_time() - identity.create_time) > 0.05:
            return False, f"pid {identity.pid} is now another process"
        token = process.environ().get(LAUNCH_TOKEN_ENV)
        if token != identity.launch_token:
            return False, f"pid {identity.pid} does not carry the recorded launch token"
        if argv_fingerprint(process.cmdline()) != identity.argv_fingerprint:
            return False, f"pid {identity.pid} runs another command line"
    except psutil.NoSuchProcess:
        return False, f"pid {identity.pid} has exited"
    except psutil.AccessDenied:
        return False, f"pid {identity.pid} cannot be inspected (access denied)"
    return True, ""


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
    """Whether any process of the group is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


@dataclass(frozen=True, slots=True)
class Termination:
    """How a stop ended: the leader's exit (when it was our child) and whether the group is gone.

    ``gone`` False means the group outlived TERM, TERM and KILL: the caller must keep what it
    holds for it (its reservation) and say so.
    """

    exit_code: int | None
    signal: int | None
    gone: bool
    detail: str = ""


async def terminate_group(
    pgid: int,
    *,
    child: subprocess.Popen[bytes] | None = None,
    identity: ProcessIdentity | None = None,
    grace: float = 2.0,
    second_grace: float = 1.0,
    kill_wait: float = 5.0,
) -> Termination:
    """Stop a process group and verify it is gone.

    TERM the group and wait ``grace``; TERM again (llama-server hangs on the first one while a
    request is in flight, and ends at the second), wait ``second_grace``; then KILL and wait
    ``kill_wait``. A group that is not our child is signalled only after ``identity`` is
    re-checked (same pid, start time, boot, token and command line): a pid that is now
    another process's is never signalled, and counts as gone.
    """
    if child is None and identity is not None:
        matches, why = identity_matches(identity)
        if not matches:
            return Termination(None, None, True, why)
    steps = ((signal.SIGTERM, grace), (signal.SIGTERM, second_grace), (signal.SIGKILL, kill_wait))
    for signum, wait in steps:
        _signal_group(pgid, signum)
        deadline = anyio.current_time() + wait
        while anyio.current_time() < deadline:
            if child is not None:
                child.poll()
            if not group_alive(pgid):
                return _status(child, gone=True)
            await anyio.sleep(0.02)
    if child is not None:
        child.poll()
    if not group_alive(pgid):
        return _status(child, gone=True)
    return _status(child, gone=False, detail=f"process group {pgid} is still alive after KILL")


def _status(child: subprocess.Popen[bytes] | None, *, gone: bool, detail: str = "") -> Termination:
    if child is None or child.returncode is None:
        return Termination(None, None, gone, detail)
    code = child.returncode
    if code < 0:
        return Termination(None, -code, gone, detail)
    return Termination(code, None, gone, detail)
