"""The session guard ends what a test run started, however the run ends (real processes)."""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
import pytest

from _session_guard import SessionGuard
from _session_sweep import (
    MARKER_ENV,
    _session_running,
    end,
    find_marked,
    start_mark,
    sweep,
    tokens,
    wait_ended,
    with_token,
)

TESTS = Path(__file__).resolve().parent
#: Generous: a loaded machine still passes. Every wait below ends as soon as its state is seen.
PATIENCE = 30.0

#: A process that starts a grandchild in its own session, both report their pids, both stay.
FAMILY = """
import os, subprocess, sys, time
grandchild = "import os, time; print('grandchild', os.getpid(), flush=True); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", grandchild], start_new_session=True)
print("child", os.getpid(), flush=True)
time.sleep(600)
"""
#: A process that says it is running, then stays (``IGNORE_TERM`` in its environment: SIGTERM
#: is ignored).
SLEEPER = """
import os, signal, time
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("sleeper", os.getpid(), flush=True)
time.sleep(600)
"""


def _read_until(
    process: subprocess.Popen[bytes], done: Callable[[list[str]], bool], what: str
) -> list[str]:
    """Read ``process``'s stdout until ``done(lines)``; fail after :data:`PATIENCE` or at EOF."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    data = b""
    deadline = time.monotonic() + PATIENCE
    while not done(data.decode(errors="replace").splitlines()):
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(remaining, 0.0))
        assert ready, f"no {what} within {PATIENCE} s; read so far: {data.decode()!r}"
        chunk = os.read(fd, 65536)
        assert chunk, f"EOF before {what}; read: {data.decode()!r}"
        data += chunk
    return data.decode().splitlines()


def _pids(lines: list[str]) -> dict[str, int]:
    """``label pid`` lines, by label."""
    return {
        parts[0]: int(parts[1])
        for parts in (line.split() for line in lines)
        if len(parts) == 2 and parts[1].isdigit()
    }


@contextmanager
def _started(code: str, env: dict[str, str], expect: set[str]) -> Iterator[dict[str, int]]:
    """``python -c code``; yields the pids it reports (labels ``expect``) once all reported.

    Whatever is still running at the end is killed (the grandchild included) and reaped.
    """
    process = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    reported: list[psutil.Process] = []
    try:
        lines = _read_until(process, lambda lines: expect <= _pids(lines).keys(), str(expect))
        pids = _pids(lines)
        reported = [psutil.Process(pid) for pid in pids.values()]
        yield pids
    finally:
        for each in reported:  # by pid and start time: never another process under a reused pid
            with suppress(psutil.Error):
                each.kill()
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def _marked_env(token: str) -> dict[str, str]:
    """This environment, with ``token`` added to the session marker (as a nested session's)."""
    return {**os.environ, MARKER_ENV: with_token(os.environ.get(MARKER_ENV), token)}


def _token() -> str:
    return f"test-{secrets.token_hex(6)}"


def test_the_marker_chains_the_tokens_of_nested_sessions() -> None:
    assert with_token(None, "a") == "a"
    assert with_token("", "a") == "a"
    assert with_token("a", "b") == "a,b"
    assert tokens({MARKER_ENV: "a,b"}) == ["a", "b"]
    assert tokens({}) == []


def test_the_session_itself_carries_a_marker_its_children_inherit() -> None:
    assert tokens(dict(os.environ)), "the guard (tests/conftest.py) did not set the marker"


def test_the_sweep_ends_a_marked_child_and_grandchild_and_nothing_else() -> None:
    token = _token()
    unmarked = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
    with (
        _started(FAMILY, _marked_env(token), {"child", "grandchild"}) as family,
        _started(SLEEPER, dict(os.environ), {"sleeper"}) as other_session,
        _started(SLEEPER, unmarked, {"sleeper"}) as no_marker,
    ):
        processes = {name: psutil.Process(pid) for name, pid in family.items()}

        ended = sweep(token)

        assert sorted(leftover.pid for leftover in ended) == sorted(family.values())
        assert not any(leftover.killed for leftover in ended)  # SIGTERM was enough
        assert wait_ended(processes.values(), PATIENCE) == []
        # a process of this session but not of that token, and one without a marker: untouched
        for pid in (other_session["sleeper"], no_marker["sleeper"]):
            assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert find_marked(token) == []


def test_a_process_that_ignores_sigterm_gets_sigkill_after_the_grace() -> None:
    token = _token()
    with _started(SLEEPER, {**_marked_env(token), "IGNORE_TERM": "1"}, {"sleeper"}) as stubborn:
        process = psutil.Process(stubborn["sleeper"])

        ended = sweep(token, grace=0.5)

        assert [(leftover.pid, leftover.killed) for leftover in ended] == [(process.pid, True)]
        assert wait_ended([process], PATIENCE) == []


def test_a_process_gone_since_it_was_listed_is_not_signalled() -> None:
    token = _token()
    with _started(SLEEPER, _marked_env(token), {"sleeper"}) as sleeper:
        found = find_marked(token)
        assert [leftover.pid for leftover in found] == [sleeper["sleeper"]]
        found[0].process.kill()
        assert wait_ended([found[0].process], PATIENCE) == []

        assert end(found) == []  # its (pid, start time) names nothing now: no signal sent


def test_a_guard_sets_the_marker_sweeps_at_finish_and_puts_everything_back() -> None:
    outer = os.environ.get(MARKER_ENV)
    handler = signal.getsignal(signal.SIGTERM)
    guard = SessionGuard()
    guard.start()
    try:
        assert os.environ[MARKER_ENV] == with_token(outer, guard.token)
        assert signal.getsignal(signal.SIGTERM) != handler
        assert guard.watchdog_pid is not None
        watchdog = psutil.Process(guard.watchdog_pid)
        assert guard.token not in tokens(watchdog.environ())  # it never sweeps itself
        with _started(SLEEPER, dict(os.environ), {"sleeper"}) as sleeper:
            leftover = psutil.Process(sleeper["sleeper"])

            assert [entry.pid for entry in guard.finish()] == [leftover.pid]
            assert wait_ended([leftover, watchdog], PATIENCE) == []
    finally:
        guard.finish()
    assert os.environ.get(MARKER_ENV) == outer
    assert signal.getsignal(signal.SIGTERM) == handler
    assert [entry.pid for entry in guard.finish()] == [leftover.pid]  # idempotent


#: The run inside a test: its one test leaves a FAMILY running, says so, then fails or hangs.
INNER_TEST = f"""
import os, signal, subprocess, sys, time

FAMILY = {FAMILY!r}


def test_leaves_a_family_running():
    # held until the outer test has looked at the family (its SIGUSR1): the session's sweep at
    # the end of this run must not come first, however loaded the machine
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})
    family = subprocess.Popen(
        [sys.executable, "-c", FAMILY],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    lines = [family.stdout.readline().decode().strip() for _ in range(2)]
    os.write(1, ("LEAKED " + " ".join(lines) + "\\n").encode())
    if os.environ["INNER_MODE"] == "hang":
        time.sleep(600)  # until the outer test signals this run
    signal.sigwait({{signal.SIGUSR1}})
    assert False, "fails on purpose"
"""


@contextmanager
def _inner_run(tmp_path: Path, mode: str) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m pytest`` on :data:`INNER_TEST` with the guard (``-p``), in ``tmp_path``."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "INNER_MODE": mode,
    }
    argv = [sys.executable, "-m", "pytest", "-s", "-q", "-p", "_session_guard"]
    argv += ["-p", "no:cacheprovider", "test_inner.py"]
    run = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        yield run
    finally:
        run.kill()
        run.wait()
        assert run.stdout is not None
        run.stdout.close()


def _command_line(process: psutil.Process) -> str:
    """Its command line; "" for one that ended since it was listed (a child of the run may)."""
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return ""


def _leaked(run: subprocess.Popen[bytes]) -> tuple[list[psutil.Process], psutil.Process]:
    """The inner test's leftover family, and the inner run's watchdog, once it has leaked."""
    lines = _read_until(run, lambda lines: any(x.startswith("LEAKED") for x in lines), "LEAKED")
    line = next(x for x in lines if x.startswith("LEAKED"))
    pids = _pids([" ".join(pair) for pair in zip(*[iter(line.split()[1:])] * 2, strict=True)])
    family = [psutil.Process(pids["child"]), psutil.Process(pids["grandchild"])]
    watchdogs = [
        process
        for process in psutil.Process(run.pid).children()
        if "_session_sweep.py" in _command_line(process)
    ]
    assert len(watchdogs) == 1, watchdogs
    outer = tokens(dict(os.environ))
    for process in family:  # the outer session's tokens, then the inner one's
        marker = tokens(process.environ())
        assert marker[: len(outer)] == outer
        assert len(marker) == len(outer) + 1
    assert tokens(watchdogs[0].environ()) == outer  # not the inner token: it never sweeps itself
    return family, watchdogs[0]


def _rest(run: subprocess.Popen[bytes]) -> str:
    """The run's remaining output (its watchdog's report included), once every writer closed."""
    out, _ = run.communicate(timeout=PATIENCE)
    return out.decode(errors="replace")


@pytest.mark.parametrize(
    ("sig", "returncode", "says"),
    [
        (signal.SIGKILL, -signal.SIGKILL, "ended without cleaning up"),
        (signal.SIGTERM, -signal.SIGTERM, "got SIGTERM"),
        (signal.SIGINT, pytest.ExitCode.INTERRUPTED, "session guard: leftover processes ended"),
    ],
    ids=["SIGKILL", "SIGTERM", "Ctrl-C"],
)
def test_a_killed_or_interrupted_run_leaves_nothing_running(
    tmp_path: Path, sig: signal.Signals, returncode: int, says: str
) -> None:
    with _inner_run(tmp_path, "hang") as run:
        family, watchdog = _leaked(run)

        run.send_signal(sig)

        assert run.wait(timeout=PATIENCE) == returncode
        assert wait_ended([*family, watchdog], PATIENCE) == []
        output = _rest(run)
        assert says in output, output
        for process in family:
            assert f"pid {process.pid} (SIGTERM)" in output, output


def test_a_failing_run_leaves_nothing_running(tmp_path: Path) -> None:
    with _inner_run(tmp_path, "fail") as run:
        family, watchdog = _leaked(run)
        run.send_signal(signal.SIGUSR1)  # looked at: the inner test may fail now

        assert run.wait(timeout=PATIENCE) == pytest.ExitCode.TESTS_FAILED
        assert wait_ended([*family, watchdog], PATIENCE) == []
        output = _rest(run)
        assert "1 failed" in output, output
        assert "session guard: leftover processes ended" in output, output
        for process in family:
            assert f"pid {process.pid} (SIGTERM)" in output, output


#: A program that starts a guard and a marked sleeper, then exits with no session finish.
EXITS_WITHOUT_FINISH = f"""
import subprocess, sys
sys.path.insert(0, {str(TESTS)!r})
from _session_guard import SessionGuard
SessionGuard().start()
child = subprocess.Popen([sys.executable, "-c", {SLEEPER!r}], stdout=subprocess.PIPE)
print(child.stdout.readline().decode().strip(), flush=True)
"""


def test_a_run_that_exits_without_a_session_finish_is_swept_at_exit() -> None:
    program = subprocess.Popen(
        [sys.executable, "-c", EXITS_WITHOUT_FINISH],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        lines = _read_until(program, lambda lines: "sleeper" in _pids(lines), "the sleeper")
        pid = _pids(lines)["sleeper"]
        try:
            sleeper: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:  # on a loaded machine the sweep at exit may come first
            sleeper = None
        out, _ = program.communicate(timeout=PATIENCE)
        assert program.returncode == 0
        assert sleeper is None or wait_ended([sleeper], PATIENCE) == []
        # on a loaded machine the report may already have come with the sleeper's line
        said = "\n".join(lines) + "\n" + out.decode()
        assert "exited without a session finish" in said, said
        assert f"pid {pid} (SIGTERM)" in said, said
    finally:
        program.kill()
        program.wait()
        assert program.stdout is not None
        program.stdout.close()


def test_a_wall_clock_step_does_not_make_a_live_session_look_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found beside two burning processes on a VM restored from a snapshot: the clock stepped,
    psutil's create_time (boot time as the wall clock sees it now) moved, the controller's
    watchdog took the live pytest for a dead one and swept every xdist worker."""
    created = start_mark(psutil.Process())
    before = psutil.Process().create_time()
    import psutil._pslinux as pslinux

    stepped = pslinux.boot_time() + 3600.0
    monkeypatch.setattr(pslinux, "boot_time", lambda: stepped)
    assert psutil.Process().create_time() - before == pytest.approx(3600.0, abs=1.0)
    assert start_mark(psutil.Process()) == created  # ticks since boot: never moved
    assert _session_running(os.getpid(), created)
    assert not _session_running(os.getpid(), created + 1.0)  # another start: another process
