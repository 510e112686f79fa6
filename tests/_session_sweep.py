"""Find and end the processes of one test session by the marker in their environment.

The session guard (``_session_guard.py``, a pytest plugin) puts ``HOSTLER_TEST_SESSION`` in
the environment of the pytest process, so every process a test starts (and every process
those start) carries it. This module finds the processes that carry one session's token and
ends them: SIGTERM, a bounded wait, then SIGKILL.

It needs the standard library and psutil only, never pytest: the guard's watchdog runs this
file as a script (``python _session_sweep.py watch ...``), and so can a person::

    python tests/_session_sweep.py list          # every process that carries a marker
    python tests/_session_sweep.py end TOKEN     # end one session's processes
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import sys
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

import psutil

#: The environment variable that marks a process as started by a test session.
MARKER_ENV = "HOSTLER_TEST_SESSION"
#: Between the tokens of nested sessions (a pytest run inside a test): the outer ones first.
SEPARATOR = ","
#: Seconds a process gets between SIGTERM and SIGKILL.
TERM_GRACE = 5.0
#: Seconds to wait, after SIGKILL, for the kernel to end a process.
KILL_WAIT = 5.0
#: How many times a sweep lists again after ending what it found (a process can start, or
#: finish its exec, while the previous round was ending the others).
ROUNDS = 3
#: What the session writes on the watchdog's pipe when it has swept itself: "exit, no sweep".
DONE = b"."
#: Seconds between the watchdog's checks that the session's process still runs. Only a
#: backstop: the pipe's EOF is the signal, but a child forked (not exec'd) by the session holds
#: the pipe's write end, and then only the check notices that the session is gone.
PARENT_POLL = 2.0


def tokens(environ: Mapping[str, str]) -> list[str]:
    """The session tokens an environment carries (empty when it carries no marker)."""
    return [token for token in environ.get(MARKER_ENV, "").split(SEPARATOR) if token]


def carries(environ: Mapping[str, str], token: str) -> bool:
    """Whether an environment carries ``token`` (its own session's, or an outer one's)."""
    return token in tokens(environ)


def with_token(value: str | None, token: str) -> str:
    """The marker of a session inside one whose marker is ``value`` (None: not nested)."""
    return f"{value}{SEPARATOR}{token}" if value else token


@dataclasses.dataclass(frozen=True)
class Leftover:
    """A process that carries a session's token.

    ``process`` holds psutil's identity of it (its pid and its start time): every signal is
    sent only after checking that the pid still names that same process.
    """

    process: psutil.Process
    pid: int
    create_time: float
    command: str
    #: The value of its ``HOSTLER_TEST_SESSION``: its session's token, after any outer ones.
    marker: str
    #: Set by :func:`end`: it was still running after SIGTERM and its grace, and got SIGKILL.
    killed: bool = False

    def describe(self) -> str:
        """One line for a report: pid, how it was ended, command line."""
        how = "SIGKILL" if self.killed else "SIGTERM"
        return f"pid {self.pid} ({how}): {self.command}"


def _command(process: psutil.Process) -> str:
    try:
        argv = process.cmdline()
    except psutil.Error:
        argv = []
    text = " ".join(argv) if argv else f"[{_name(process)}]"
    return text if len(text) <= 160 else text[:157] + "..."


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.Error:
        return "?"


def start_mark(process: psutil.Process) -> float:
    """When ``process`` started: seconds since boot where the kernel says (Linux), else wall time.

    psutil's ``create_time()`` adds the boot time as the wall clock sees it now, so a clock
    step (NTP, a virtual machine restored from a snapshot) moves every process's start: a
    watchdog comparing those took a live pytest for a dead one and swept its workers. The
    kernel's count of ticks since boot (``/proc/PID/stat``, field 22) never moves.
    """
    try:
        stat = Path(f"/proc/{process.pid}/stat").read_bytes()
        fields = stat.rsplit(b")", 1)[1].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return process.create_time()


def find_marked(token: str | None, *, exclude: Collection[int] = ()) -> list[Leftover]:
    """The live processes whose environment carries ``token`` (None: any session's marker).

    Never this process, nor the pids in ``exclude``. Processes whose environment cannot be
    read (another user's: AccessDenied), that are gone, or that are zombies are skipped.
    """
    skip = {os.getpid(), *exclude}
    found: list[Leftover] = []
    for process in psutil.process_iter():
        if process.pid in skip:
            continue
        try:
            environ = process.environ()
            marked = bool(tokens(environ)) if token is None else carries(environ, token)
            # the environment read was this process's, not a later one's under its pid
            if marked and process.is_running():
                found.append(
                    Leftover(
                        process,
                        process.pid,
                        start_mark(process),
                        _command(process),
                        environ[MARKER_ENV],
                    )
                )
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return found


def _signal(leftover: Leftover, sig: signal.Signals) -> bool:
    """Send ``sig`` if the pid still names that process (pid and start time); whether sent."""
    try:
        if not leftover.process.is_running():  # gone, or its pid reused: never signalled
            return False
        leftover.process.send_signal(sig)  # psutil checks the identity once more
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return True


def _ended(process: psutil.Process) -> bool:
    """Gone, or a zombie (dead; only its parent's wait is missing)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def wait_ended(processes: Iterable[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` seconds for the processes to end; those still alive.

    A zombie counts as ended: it is dead, only its parent has not collected it yet.
    """
    deadline = time.monotonic() + timeout
    alive = list(processes)
    while alive:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        # short slices, so a zombie (which psutil's wait counts as alive) does not hold the
        # whole grace: it is dropped between slices
        _, still = psutil.wait_procs(alive, timeout=min(remaining, 0.25))
        alive = [process for process in still if not _ended(process)]
    return alive


def end(
    leftovers: Sequence[Leftover], *, grace: float = TERM_GRACE, kill_wait: float = KILL_WAIT
) -> list[Leftover]:
    """End the processes: SIGTERM, up to ``grace`` seconds, SIGKILL to the rest.

    Returns the processes that were signalled (``killed`` set on those that needed SIGKILL);
    one already gone, or whose pid now names another process, is left alone and left out.
    """
    signalled = [leftover for leftover in leftovers if _signal(leftover, signal.SIGTERM)]
    alive = wait_ended([leftover.process for leftover in signalled], grace)
    result: list[Leftover] = []
    stubborn: list[psutil.Process] = []
    for leftover in signalled:
        if leftover.process in alive and _signal(leftover, signal.SIGKILL):
            stubborn.append(leftover.process)
            leftover = dataclasses.replace(leftover, killed=True)  # noqa: PLW2901
        result.append(leftover)
    wait_ended(stubborn, kill_wait)
    return result


def sweep(
    token: str, *, exclude: Collection[int] = (), grace: float = TERM_GRACE
) -> list[Leftover]:
    """Find the processes that carry ``token`` and end them, in up to :data:`ROUNDS` rounds.

    Never this process, nor the pids in ``exclude``. Returns the processes it ended.
    """
    ended: list[Leftover] = []
    for _ in range(ROUNDS):
        found = find_marked(token, exclude=exclude)
        if not found:
            break
        ended.extend(end(found, grace=grace))
    return ended


def report(ended: Sequence[Leftover], why: str) -> str:
    """The lines that say which processes were ended, and why."""
    lines = [f"hostler test session guard: {why}; ended {len(ended)} process(es) it left:"]
    lines.extend(f"  {leftover.describe()}" for leftover in ended)
    return "\n".join(lines)


def _session_running(pid: int, created: float) -> bool:
    """Whether ``pid`` is still the session's process (same start time) and not a zombie."""
    try:
        process = psutil.Process(pid)
        # ticks since boot, read by two processes: the same to the tick, whatever the clock did
        return abs(start_mark(process) - created) < 0.05 and not _ended(process)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def watch(fd: int, token: str, parent: int, parent_created: float) -> int:
    """The watchdog: wait for the session to end, then sweep unless it said it swept itself.

    ``fd`` is the read end of a pipe whose write end only the session's process holds. It
    reads :data:`DONE` when the session swept itself (exit at once), EOF when that process
    died (SIGKILL included: the kernel closes its end). Then it sweeps ``token``.
    """
    while True:
        ready, _, _ = select.select([fd], [], [], PARENT_POLL)
        if ready:
            if os.read(fd, 1) == DONE:
                return 0
            break  # EOF: the session's process is gone
        if not _session_running(parent, parent_created):
            break
    ended = sweep(token)
    if ended:
        why = f"the test run (pid {parent}) ended without cleaning up"
        with contextlib.suppress(OSError):  # nobody reads pytest's stderr any more
            print(report(ended, why), file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str]) -> int:
    """``watch FD TOKEN PID CREATED`` (the guard's watchdog), ``list [TOKEN]``, ``end TOKEN``."""
    match list(argv):
        case ["watch", fd, token, parent, created]:
            return watch(int(fd), token, int(parent), float(created))
        case ["list", *rest] if len(rest) <= 1:
            for leftover in find_marked(rest[0] if rest else None):
                print(f"{leftover.pid}\t{MARKER_ENV}={leftover.marker}\t{leftover.command}")
            return 0
        case ["end", token]:
            ended = sweep(token)
            if ended:
                print(report(ended, f"asked to end session {token}"))
            return 0
        case _:
            print(__doc__, file=sys.stderr)
            return 2


if __name__ == "__main__":
    # the watchdog leaves the signals alone: it runs in its own session, so a Ctrl-C in the
    # terminal reaches pytest, not it
    raise SystemExit(main(sys.argv[1:]))
