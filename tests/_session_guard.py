"""A pytest plugin that ends every process a test run started, however the run ends.

At session start it puts ``HOSTLER_TEST_SESSION=<token>`` in ``os.environ``: every process a
test starts inherits it, and so does every process those start (a daemon's engines). At the
end the processes that still carry the token are ended (``_session_sweep.py``: SIGTERM, a
bounded wait, SIGKILL):

- at ``pytest_sessionfinish`` (last, after the session's fixtures are torn down): a passing,
  failing or interrupted (Ctrl-C) run;
- on SIGTERM, before the handler that was there before (the default one: pytest then dies of
  the signal, as it would have);
- at exit (``atexit``), should the run end without a session finish;
- by a watchdog when pytest is SIGKILLed: a small process in its own session that waits on a
  pipe whose write end only pytest holds. The session writes one byte on it when it has swept
  itself (the watchdog exits); EOF means pytest died, and the watchdog sweeps.

A process without the token is never touched. Turned on in ``tests/conftest.py``
(``pytest_plugins``); ``-p no:_session_guard`` turns it off for one run.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Literal

import psutil
import pytest

from _session_sweep import DONE, MARKER_ENV, Leftover, report, start_mark, sweep, with_token

#: The watchdog's script: standard library and psutil only.
WATCHDOG = Path(__file__).with_name("_session_sweep.py")
#: Seconds the watchdog gets to exit once told that the session swept itself.
WATCHDOG_EXIT = 5.0

_Handler = Callable[[int, FrameType | None], object] | int


class SessionGuard:
    """One session's marker token, its watchdog, and the sweep of what carries the token."""

    def __init__(self) -> None:
        self.token = f"{os.getpid()}-{secrets.token_hex(8)}"
        #: The processes the session's own sweep ended (the run left them running).
        self.ended: list[Leftover] = []
        self._owner = os.getpid()
        self._state: Literal["new", "running", "done"] = "new"
        self._sweeping = False
        self._outer_marker: str | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None
        self._previous_sigterm: _Handler = signal.SIG_DFL
        self._handles_sigterm = False
        self._stderr: int | None = None

    @property
    def watchdog_pid(self) -> int | None:
        """The watchdog's pid (None: not started, or already gone)."""
        return None if self._watchdog is None else self._watchdog.pid

    def start(self) -> None:
        """Start the watchdog, set the marker, and hook SIGTERM and exit."""
        if self._state != "new":
            return
        self._state = "running"
        self._outer_marker = os.environ.get(MARKER_ENV)
        # the stderr pytest started with (its capture is suspended at session start): a report
        # written there from a SIGTERM or at exit is seen even when a test's output is captured
        try:
            self._stderr = os.dup(2)
        except OSError:
            self._stderr = None
        # the watchdog carries the outer sessions' tokens (a nested run's watchdog is ended by
        # the outer sweep), never this session's: it is not what it sweeps
        self._start_watchdog(dict(os.environ))
        os.environ[MARKER_ENV] = with_token(self._outer_marker, self.token)
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGTERM)
            # chained to: the default (die of it) or a Python handler. Not when it is ignored
            # (the run does not end on it), nor a handler set outside Python (None: it cannot
            # be called, nor put back); the watchdog covers a run that dies of it then.
            if previous is signal.SIG_DFL or callable(previous):
                self._previous_sigterm = previous
                signal.signal(signal.SIGTERM, self._on_sigterm)
                self._handles_sigterm = True
        atexit.register(self._finish_at_exit)

    def _start_watchdog(self, env: dict[str, str]) -> None:
        created = start_mark(psutil.Process())
        read_end, write_end = os.pipe()  # both non-inheritable: only the watchdog gets read_end
        argv = [sys.executable, str(WATCHDOG), "watch", str(read_end), self.token]
        argv += [str(os.getpid()), repr(created)]
        try:
            self._watchdog = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # its report goes to pytest's stderr
                pass_fds=(read_end,),
                start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, not it
                env=env,
            )
        except OSError as exc:
            os.close(write_end)
            self._tell(f"hostler test session guard: no watchdog ({exc})")
        else:
            self._pipe = write_end
        finally:
            os.close(read_end)

    def sweep(self) -> list[Leftover]:
        """End the processes that carry this session's token now; those it ended.

        Nothing in a process forked from the session's (a forked child inherits the hooks),
        nor while a sweep is already running (a SIGTERM during the session's own sweep).
        """
        if os.getpid() != self._owner or self._sweeping or self._state != "running":
            return []
        self._sweeping = True
        try:
            exclude = () if self._watchdog is None else (self._watchdog.pid,)
            ended = sweep(self.token, exclude=exclude)
        finally:
            self._sweeping = False
        self.ended.extend(ended)
        return ended

    def finish(self) -> list[Leftover]:
        """Sweep, stop the watchdog, and put back the marker and SIGTERM's handler.

        Idempotent (the session finish, then exit); returns what the session's sweeps ended.
        """
        if os.getpid() != self._owner or self._state != "running" or self._sweeping:
            return self.ended
        try:
            self.sweep()
        finally:
            self._state = "done"
            self._stop_watchdog()
            self._restore()
        return self.ended

    def _stop_watchdog(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):  # the watchdog is gone already
                os.write(self._pipe, DONE)
            os.close(self._pipe)
            self._pipe = None
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=WATCHDOG_EXIT)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
            self._watchdog = None

    def _restore(self) -> None:
        if self._outer_marker is None:
            os.environ.pop(MARKER_ENV, None)
        else:
            os.environ[MARKER_ENV] = self._outer_marker
        if self._handles_sigterm and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        self._handles_sigterm = False
        atexit.unregister(self._finish_at_exit)
        if self._stderr is not None:
            os.close(self._stderr)
            self._stderr = None

    def _tell(self, text: str) -> None:
        """Write a line to the stderr pytest started with (nothing if there is none)."""
        if self._stderr is not None:
            with contextlib.suppress(OSError):
                os.write(self._stderr, (text + "\n").encode(errors="replace"))

    def _finish_at_exit(self) -> None:
        """The exit's sweep: reported on stderr (the terminal summary has been written)."""
        ended = self.sweep()
        if ended:
            self._tell(report(ended, "the test run exited without a session finish"))
        self.finish()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """Sweep, then do what the handler before this one did."""
        previous = self._previous_sigterm
        ended = self.sweep()
        if ended:
            self._tell(report(ended, "the test run got SIGTERM"))
        if callable(previous):
            previous(signum, frame)
            return
        # the default action (or a handler not set from Python): die of the signal. The
        # watchdog sees the pipe close, finds nothing left, and exits.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


_GUARD = pytest.StashKey[SessionGuard]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Set the marker before any other plugin or fixture starts a process."""
    guard = SessionGuard()
    session.config.stash[_GUARD] = guard
    guard.start()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Sweep after everything else has finished (session fixtures are torn down by then)."""
    guard = session.config.stash.get(_GUARD, None)
    if guard is not None:
        guard.finish()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the processes the run left running, which the guard ended."""
    guard = terminalreporter.config.stash.get(_GUARD, None)
    if guard is None or not guard.ended:
        return
    terminalreporter.write_sep("=", "session guard: leftover processes ended", yellow=True)
    for leftover in guard.ended:
        terminalreporter.write_line(leftover.describe())
