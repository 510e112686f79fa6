"""engine.log is capped: copy-then-truncate rotation, the newest N kept, the tailer carries on.

Issue "Bad input and broken storage": ``engine.log`` grew without bound. The engine writes
the file itself (an inherited ``O_APPEND`` descriptor) and outlives the daemon, so hostler
rotates it by copy-then-truncate; the follower that detects readiness and keeps the crash
tail must survive the file shrinking under it.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import anyio
import pytest

from hostler import EventStore
from hostler.engines.logs import LogFollower, rotate_log, rotated_path
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.plugin import LaunchSpec

from _fake_engine import FakeEngine

KEY = "fake:http:0"
KIB = 1024


def append(path: Path, data: bytes) -> None:
    """Write as the engine does: through an O_APPEND descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def lines_of(n: int, tag: str, width: int = 100) -> bytes:
    return b"".join(f"{tag} {i:06d} ".encode().ljust(width, b"x") + b"\n" for i in range(n))


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


# -- rotate_log ----------------------------------------------------------------------------


def test_a_log_under_the_cap_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    assert not rotate_log(log, max_bytes=10 * KIB, keep=3)  # no file yet: nothing to do
    append(log, lines_of(10, "a"))
    assert not rotate_log(log, max_bytes=10 * KIB, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.log"]


def test_rotation_keeps_the_newest_n_copies_each_0600(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    cap, keep = 8 * KIB, 3
    for round_ in range(6):
        append(log, lines_of(100, f"round{round_}"))  # 10 KB: over the cap every round
        assert log.stat().st_size > cap
        assert rotate_log(log, max_bytes=cap, keep=keep)
        assert log.stat().st_size == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["engine.log", "engine.log.1", "engine.log.2", "engine.log.3"]
    # newest first: .1 holds the last round, .3 the oldest kept; older rounds are gone
    for n, round_ in ((1, 5), (2, 4), (3, 3)):
        copy = rotated_path(log, n)
        assert copy.read_bytes() == lines_of(100, f"round{round_}")
        assert mode(copy) == 0o600
    assert mode(log) == 0o600
    assert not rotated_path(log, 4).exists()


def test_the_copy_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    append(log, lines_of(100, "a"))
    old = os.umask(0)
    try:
        rotated_path(log, 1).write_bytes(b"stale")
        rotated_path(log, 1).chmod(0o644)
        assert rotate_log(log, max_bytes=1 * KIB, keep=2)
    finally:
        os.umask(old)
    assert mode(rotated_path(log, 1)) == 0o600
    assert mode(rotated_path(log, 2)) == 0o644  # shifted as it was: not ours to widen
    assert rotated_path(log, 2).read_bytes() == b"stale"


def test_keep_zero_truncates_without_a_copy(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    append(log, lines_of(100, "a"))
    assert rotate_log(log, max_bytes=1 * KIB, keep=0)
    assert log.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.log"]


def test_the_writer_s_o_append_descriptor_writes_at_the_new_start(tmp_path: Path) -> None:
    """The engine keeps its descriptor; after the truncation it must not leave a hole."""
    log = tmp_path / "engine.log"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, lines_of(200, "before"))
        assert rotate_log(log, max_bytes=4 * KIB, keep=1)
        os.write(fd, b"after\n")
    finally:
        os.close(fd)
    assert log.read_bytes() == b"after\n"
    assert rotated_path(log, 1).read_bytes() == lines_of(200, "before")


# -- the follower across a rotation ---------------------------------------------------------


def test_the_follower_reads_on_across_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    append(log, lines_of(50, "old"))
    follower = LogFollower(log)  # from the end, as the supervisor starts it
    append(log, lines_of(50, "read"))
    assert len(follower.new_lines()) == 50
    # written but not read yet when the rotation comes, the last line unfinished
    append(log, b"unread one\nunread tw")
    assert rotate_log(log, max_bytes=4 * KIB, keep=2)
    append(log, b"o\nnew one\nnew two\n")  # the same line, finished after the rotation
    assert follower.new_lines() == ["unread one", "unread two", "new one", "new two"]
    append(log, b"later\n")
    assert follower.new_lines() == ["later"]
    # the crash tail spans the rotation: the copy's end, then the live file
    tail = follower.tail(200)
    assert tail.endswith("o\nnew one\nnew two\nlater\n")
    assert "unread one" in tail


def test_a_log_cut_by_hand_restarts_from_the_beginning(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    follower = LogFollower(log, from_end=False)
    append(log, lines_of(50, "a") + b"half a li")
    assert len(follower.new_lines()) == 50
    os.truncate(log, 0)  # no rotated copy: what followed is gone, the half line with it
    append(log, b"fresh\n")
    assert follower.new_lines() == ["fresh"]


# -- the supervisor rotates a live engine's log -------------------------------------------


def get(port: int, path: str) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
        reply.read()


@pytest.mark.anyio
async def test_the_supervisor_caps_a_running_engine_s_log(
    store: EventStore, tmp_path: Path
) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    cap, keep = 64 * KIB, 2
    sup = Supervisor(
        KEY,
        FakeEngine(tmp_path),
        lambda port: LaunchSpec(KEY, model, port, ctx_per_slot=512, slots=1),
        store,
        run_dir=tmp_path / "run",
        token_prefix="logs-test",
        policy=SupervisorPolicy(
            watch_interval=0.02, log_max_bytes=cap, log_keep=keep, log_check_interval=0.02
        ),
    )
    log = sup.log_path
    log.parent.mkdir(mode=0o700)
    append(log, lines_of(2000, "an earlier run"))  # 200 KB left over: rotated before spawn
    port = await sup.ensure_running()
    child = sup._child
    assert child is not None
    try:
        assert rotated_path(log, 1).read_bytes() == lines_of(2000, "an earlier run")
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sup.watch)
            for _ in range(4):
                await anyio.to_thread.run_sync(get, port, "/spam/1500")  # ~170 KB each
                with anyio.fail_after(10):
                    while log.stat().st_size > cap:
                        await anyio.sleep(0.02)
            await anyio.to_thread.run_sync(get, port, "/after-the-rotations")
            with anyio.fail_after(10):
                while "asked for /after-the-rotations" not in child.lines:
                    await anyio.sleep(0.02)
            tasks.cancel_scope.cancel()
        names = sorted(p.name for p in log.parent.iterdir() if p.name.startswith("engine.log"))
        assert names == ["engine.log", "engine.log.1", "engine.log.2"]  # keep=2, no .3
        assert all(mode(log.parent / name) == 0o600 for name in names)
        assert log.stat().st_size <= cap
        assert all(rotated_path(log, n).stat().st_size < 4 * cap for n in (1, 2))
        assert "asked for /after-the-rotations" in child.log.tail()
        assert any(line.startswith("spam ") for line in child.lines)
    finally:
        await sup.stop()
    assert sup.state == "stopped"
