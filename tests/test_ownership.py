"""Capacity has owners: reservations by (owner, key), kept while their engine runs (OW1–OW4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.ledger import Held, LedgerState, decide_adopt, state_from
from hostler.capacity.units import GIB
from hostler.drivers.host_ledger import (
    HostLedger,
    LedgerLocation,
    OwnerIdentity,
    check_ledger_directory,
    default_ledger_location,
    engine_alive,
    open_ledger_store,
    owner_alive,
)
from hostler.errors import StorePathError, UsageError
from hostler.events.ledger import (
    LEDGER_STREAM,
    LedgerAdopted,
    LedgerReleased,
    LedgerReserved,
)
from hostler.probes.host import boot_id

from _support import step_the_clock

BUDGET = compute_budget(HostMemory(system_ram=16 * GIB))  # 9.6 GiB, RAM host
KEY = "llamacpp:qwen:0"


def ledger_for(store: EventStore, label: str, **kwargs: object) -> HostLedger:
    return HostLedger(store, OwnerIdentity.current(label), lambda: BUDGET, **kwargs)  # type: ignore[arg-type]


def test_two_owners_of_the_same_key_do_not_share_a_reservation(tmp_path: Path) -> None:
    """Break 1: on main both were granted 6 GiB of 9.6 and one release wiped the other's."""
    path = tmp_path / "ledger.db"
    with EventStore.open(path) as a_store, EventStore.open(path) as b_store:
        a = ledger_for(a_store, "daemon-a")
        b = ledger_for(b_store, "daemon-b")
        assert a.reserve(KEY, 6 * GIB).granted
        denied = b.reserve(KEY, 6 * GIB)
        assert not denied.granted
        assert denied.prior == 0  # a's reservation is not b's to resize
        assert denied.committed_other == 6 * GIB
        assert b.reserve(KEY, 3 * GIB).granted  # fits beside a's: 9 of 9.6 GiB
        assert b.snapshot()["committed"] == 9 * GIB
        assert b.release(KEY) is True
        state = a.refresh()
        assert state.committed == 6 * GIB  # b's release left a's reservation alone
        assert state.held(a.owner, KEY) is not None
        assert state.held(b.owner, KEY) is None


def test_an_owners_death_frees_nothing_while_its_engine_runs(tmp_path: Path) -> None:
    """Break 15: B's next reserve released dead A's bytes although A's engine still ran."""
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ctime = _create_time(engine.pid)
        with EventStore.open(tmp_path / "ledger.db") as store:
            dead_a = HostLedger(store, OwnerIdentity(4_000_000, 1.0, "boot", "a"), lambda: BUDGET)
            assert dead_a.reserve(KEY, 6 * GIB, token="tok-a").granted
            assert dead_a.bind(KEY, engine.pid, ctime)
            b = ledger_for(store, "daemon-b")
            # A's process is gone (pid 4,000,000 never existed), its engine is alive: kept.
            assert not b.reserve("llamacpp:other:0", 6 * GIB).granted
            assert b.release_dead_owners() == []
            engine.kill()
            engine.wait()
            # Now owner and engine are both gone: the bytes come back.
            assert b.reserve("llamacpp:other:0", 6 * GIB).granted
            released = [
                r.event
                for r in store.read_stream(LEDGER_STREAM)
                if isinstance(r.event, LedgerReleased)
            ]
            assert [(e.key, e.cause) for e in released] == [(KEY, "owner-gone")]
    finally:
        engine.kill()


def test_a_reservation_not_yet_bound_is_kept_while_a_process_carries_its_token(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "HOSTLER_LAUNCH_TOKEN": "tok-loading"}
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        held = Held(KEY, GIB, "a", token="tok-loading")
        deadline = time.monotonic() + 5
        while not engine_alive(held) and time.monotonic() < deadline:
            time.sleep(0.02)  # the child's environment is readable once it has exec'd
        assert engine_alive(held)
        assert not engine_alive(Held(KEY, GIB, "a", token="tok-nobody"))
        assert not engine_alive(Held(KEY, GIB, "a"))  # names no process: pays for nothing
        assert engine_alive(
            Held(KEY, GIB, "a", pid=engine.pid, create_time=_create_time(engine.pid))
        )
        assert not engine_alive(Held(KEY, GIB, "a", pid=engine.pid, create_time=1.0))  # reused pid
    finally:
        engine.kill()
        engine.wait()


def test_adoption_takes_the_reservation_over_and_is_never_denied(tmp_path: Path) -> None:
    with EventStore.open(tmp_path / "ledger.db") as store:
        old = HostLedger(
            store,
            OwnerIdentity(4_000_001, 1.0, "boot", "old"),
            lambda: BUDGET,
            engine_alive=lambda _held: True,
        )
        assert old.reserve(KEY, 5 * GIB, token="tok-1").granted
        new = ledger_for(store, "new", engine_alive=lambda _held: True)
        assert new.reserve("llamacpp:b:0", 4 * GIB).granted
        adopted = new.adopt(KEY, 5 * GIB + 1, token="tok-1", pid=123, create_time=9.0)
        assert adopted.from_owner == old.owner
        assert adopted.over_budget == 0  # 4 GiB + 5 GiB + 1 B fits 9.6 GiB
        state = new.refresh()
        assert state.held(old.owner, KEY) is None
        assert state.held(new.owner, KEY) == Held(KEY, 5 * GIB + 1, new.owner, "tok-1", 123, 9.0)
        assert state.committed == 9 * GIB + 1
        # An engine nobody paid for is still recorded: it holds the memory whatever the ledger
        # says, and the event says by how much the ledger is now over.
        orphan = new.adopt("llamacpp:c:0", 2 * GIB, token="tok-2", pid=124, create_time=9.5)
        assert orphan.from_owner is None
        assert orphan.committed_other == 9 * GIB + 1
        assert orphan.budget == BUDGET.budget
        assert orphan.over_budget == 11 * GIB + 1 - BUDGET.budget
        assert new.refresh().committed == 11 * GIB + 1
        types = [r.type for r in store.read_stream(LEDGER_STREAM)]
        assert types.count("ledger.adopted") == 2
        assert "ledger.denied" not in types


def test_decide_adopt_edges() -> None:
    state = state_from([LedgerReserved(KEY, 4 * GIB, "a", 0, 0, 0, 0, True, "t")])
    # exactly at the budget: not over
    event = decide_adopt(
        state,
        BUDGET,
        key="k2",
        owner="b",
        wanted=BUDGET.budget - 4 * GIB,
        token=None,
        pid=1,
        create_time=1.0,
    )
    assert event.over_budget == 0
    event = decide_adopt(
        state,
        BUDGET,
        key="k2",
        owner="b",
        wanted=BUDGET.budget - 4 * GIB + 1,
        token=None,
        pid=1,
        create_time=1.0,
    )
    assert event.over_budget == 1
    with pytest.raises(ValueError, match="negative"):
        decide_adopt(
            state, BUDGET, key="k2", owner="b", wanted=-1, token=None, pid=1, create_time=1.0
        )
    # adopting its own key again replaces, never double counts
    state.apply(
        decide_adopt(
            state, BUDGET, key=KEY, owner="a", wanted=GIB, token="t", pid=2, create_time=2.0
        )
    )
    assert state.committed == GIB


def test_old_reservations_fold_as_before() -> None:
    """Schema v1 ``ledger.reserved`` (no token) upcasts; (owner, key) filing holds."""
    state = LedgerState()
    state.apply(LedgerReserved(KEY, GIB, "a", 0, 0, 0, 0, True))
    state.apply(LedgerReserved(KEY, 2 * GIB, "b", 0, 0, 0, 0, True))
    state.apply(LedgerReleased(KEY, GIB, "a", "released"))
    assert state.committed == 2 * GIB
    state.apply(LedgerAdopted(KEY, "c", 3 * GIB, "b", None, 1, 1.0, 0, 0, 0))
    assert list(state.reservations) == [("c", KEY)]


def _create_time(pid: int) -> float:
    import psutil

    return float(psutil.Process(pid).create_time())


# -- where the ledger lives (OW4) ------------------------------------------------------------


def test_the_default_ledger_is_per_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HOSTLER_LEDGER", raising=False)
    monkeypatch.delenv("HOSTLER_LEDGER_SHARED", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    location = default_ledger_location()
    assert location == LedgerLocation(tmp_path / "state" / "hostler" / "ledger.db", False)
    with open_ledger_store(location):
        pass
    assert (tmp_path / "state" / "hostler").stat().st_mode & 0o777 == 0o700
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_ledger_location().path == Path.home() / ".local/state/hostler/ledger.db"
    monkeypatch.setenv("HOSTLER_LEDGER_SHARED", "maybe")
    with pytest.raises(UsageError, match="HOSTLER_LEDGER_SHARED='maybe'"):
        default_ledger_location()


def test_a_ledger_directory_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    """Break 12: any user could create /var/tmp/hostler first and squat the ledger."""
    if os.geteuid() == 0:
        foreign = tmp_path / "squatted"
        foreign.mkdir(mode=0o777)
        os.chown(foreign, 65534, 65534)
        stranger = 65534
    else:  # a user meets root's directories
        foreign, stranger = Path("/"), 0
    with pytest.raises(StorePathError, match=f"owned by uid {stranger}, not by you"):
        check_ledger_directory(LedgerLocation(foreign / "ledger.db"))
    # shared: an administrator's group-writable directory: accepted, its file made 0660
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2770)
    with open_ledger_store(LedgerLocation(shared / "ledger.db", shared=True)):
        pass
    assert (shared / "ledger.db").stat().st_mode & 0o777 == 0o660
    shared.chmod(0o2777)
    with pytest.raises(StorePathError, match="writable by every user"):
        check_ledger_directory(LedgerLocation(shared / "ledger.db", shared=True))
    with pytest.raises(StorePathError, match="must exist"):
        check_ledger_directory(LedgerLocation(tmp_path / "nope" / "ledger.db", shared=True))
    if stranger:
        with pytest.raises(StorePathError, match=f"owned by uid {stranger}"):
            check_ledger_directory(LedgerLocation(foreign / "ledger.db", shared=True))


def test_a_bound_reservation_whose_engine_is_gone_is_released_whoever_owns_it(
    tmp_path: Path,
) -> None:
    """A live owner whose own release could not be written leaks no bytes (engine-gone)."""
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ctime = _create_time(engine.pid)
    with EventStore.open(tmp_path / "ledger.db") as store:
        a = ledger_for(store, "daemon-a")  # alive: this very process
        assert a.reserve(KEY, 6 * GIB, token="tok-a").granted
        assert a.bind(KEY, engine.pid, ctime)
        b = ledger_for(store, "daemon-b")
        assert not b.reserve("llamacpp:other:0", 6 * GIB).granted  # a's engine runs
        engine.kill()
        engine.wait()
        # a never released (its write failed, say): b's next decision finds the process gone
        assert b.reserve("llamacpp:other:0", 6 * GIB).granted
        released = [
            r.event for r in store.read_stream(LEDGER_STREAM) if isinstance(r.event, LedgerReleased)
        ]
        assert [(e.key, e.owner, e.cause) for e in released] == [(KEY, a.owner, "engine-gone")]
        # an owner's unbound reservation (a start in progress) is never taken from a live owner
        assert a.reserve("llamacpp:starting:0", GIB, token="tok-not-yet").granted
        assert b.release_dead_owners() == []
        assert a.refresh().held(a.owner, "llamacpp:starting:0") is not None


def test_a_symlinked_ledger_file_is_judged_where_it_really_is(tmp_path: Path) -> None:
    """The directory check followed the link's parent, not the file's."""
    if os.geteuid() == 0:
        foreign = tmp_path / "theirs"
        foreign.mkdir(mode=0o777)
        os.chown(foreign, 65534, 65534)
    else:
        foreign = Path("/")
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "ledger.db").symlink_to(foreign / "ledger.db")
    with pytest.raises(StorePathError, match="not by you"):
        check_ledger_directory(LedgerLocation(mine / "ledger.db"))


def test_a_ledger_file_deleted_in_use_is_reopened_and_what_runs_is_carried_over(
    tmp_path: Path,
) -> None:
    """A hostile test deleted ledger.db under two daemons: both engines then ran over budget."""
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    location = LedgerLocation(tmp_path / "ledger.db")

    def handle(label: str) -> HostLedger:
        return HostLedger(
            open_ledger_store(location),
            OwnerIdentity.current(label),
            lambda: BUDGET,
            reopen=lambda: open_ledger_store(location),
        )

    a, b = handle("daemon-a"), handle("daemon-b")
    try:
        assert a.reserve(KEY, 6 * GIB, token="tok-a").granted
        assert a.bind(KEY, engine.pid, _create_time(engine.pid))
        assert b.refresh().committed == 6 * GIB  # b knows what a holds
        for suffix in ("", "-wal", "-shm"):
            Path(f"{location.path}{suffix}").unlink(missing_ok=True)
        denied = b.reserve("llamacpp:other:0", 6 * GIB)
        assert not denied.granted  # a's running engine was carried into the new file
        assert denied.committed_other == 6 * GIB
        with EventStore.open(location.path) as fresh:
            first = fresh.read_stream(LEDGER_STREAM)[0]
        assert first.type == "ledger.carried"
        carried = first.payload
        assert carried["owner"] == a.owner and carried["carried_by"] == b.owner
        assert carried["pid"] == engine.pid and carried["bytes"] == 6 * GIB
        # a notices too, finds its reservation already there, and adds nothing twice
        assert a.check_file() is True
        assert a.refresh().committed == 6 * GIB
        engine.kill()
        engine.wait()
        assert b.reserve("llamacpp:other:0", 6 * GIB).granted  # gone: engine-gone, then fits
        assert a.check_file() is False  # nothing replaced since
    finally:
        engine.kill()
        a.store.close()
        b.store.close()


def test_an_engine_group_that_outlives_its_leader_still_holds_its_reservation() -> None:
    """The leader crashed but a child of its group still runs (and holds memory): kept."""
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "time.sleep(0.5)",
        ],
        start_new_session=True,
    )
    ctime = _create_time(leader.pid)
    held = Held(KEY, GIB, "a", token="t", pid=leader.pid, create_time=ctime)
    try:
        leader.wait(10)  # the leader is gone (and reaped) ...
        assert engine_alive(held)  # ... its group is not
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while engine_alive(held) and time.monotonic() < deadline:
        time.sleep(0.02)  # init reaps the orphan
    assert not engine_alive(held)


# -- a clock step moves wall-clock start times, not the owner --------------------------------


def test_a_clock_step_does_not_make_a_live_owner_look_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19: an owner string named the daemon by its wall-clock start time; after the clock
    was stepped a second daemon read the first, still running, as gone and released its bytes."""
    with EventStore.open(tmp_path / "ledger.db") as store:
        a = ledger_for(store, "daemon-a")
        assert a.reserve(KEY, 6 * GIB).granted
        step_the_clock(monkeypatch, 3600.0)
        b = ledger_for(store, "daemon-b")
        assert owner_alive(a.owner, this_boot=boot_id())
        assert b.release_dead_owners() == []
        assert b.refresh().held(a.owner, KEY) is not None
        assert not b.reserve("llamacpp:other:0", 6 * GIB).granted  # A's bytes are still A's


def test_an_owner_string_carries_its_ticks_and_an_old_one_still_reads() -> None:
    me = OwnerIdentity.current("daemon")
    assert me.since_boot is not None
    assert OwnerIdentity.parse(me.text()) == me
    old = OwnerIdentity.parse(f"daemon:{os.getpid()}:{me.create_time:.3f}:{me.boot}")
    assert old == OwnerIdentity(os.getpid(), round(me.create_time, 3), me.boot, "daemon")
    assert old.since_boot is None
    assert owner_alive(old.text(), this_boot=me.boot)  # judged by its wall-clock start
    assert OwnerIdentity.parse("daemon:12:1.0+x:boot") is None
    assert OwnerIdentity.parse("with:colons:12:1.5+2.25:boot") == OwnerIdentity(
        12, 1.5, "boot", "with:colons", since_boot=2.25
    )


def test_a_reused_pid_that_leads_a_group_of_its_own_keeps_nothing_alive() -> None:
    """Issue 22: the engine and its daemon were SIGKILLed, then an unrelated ``setsid sleep``
    got the engine's pid: the reservation stayed live (the group test saw a group of that id)
    until the sleep exited, and another daemon was refused room with no engine anywhere."""
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        start_new_session=True,  # a group (and session) of its own, led by the reused pid
    )
    try:
        assert os.getpgid(stranger.pid) == stranger.pid
        started = _create_time(stranger.pid)
        assert not engine_alive(Held(KEY, GIB, "a", pid=stranger.pid, create_time=started - 50))
        assert engine_alive(Held(KEY, GIB, "a", pid=stranger.pid, create_time=started))
    finally:
        stranger.kill()
        stranger.wait()
        assert stranger.stdin is not None
        stranger.stdin.close()


def test_an_engine_group_whose_leader_died_is_alive_while_a_member_runs() -> None:
    """The leader crashed while a child still holds memory: the group (whose id no process can
    take while it has a member) keeps the reservation."""
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; "
            "child = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'], "
            "stdout=subprocess.DEVNULL); print(child.pid, flush=True)",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert leader.stdout is not None
    with leader.stdout:
        child = int(leader.stdout.readline())
    started = _create_time(leader.pid)
    assert leader.wait() == 0  # the leader is gone (its exit, waited for), its child is not
    try:
        assert os.getpgid(child) == leader.pid
        assert engine_alive(Held(KEY, GIB, "a", pid=leader.pid, create_time=started))
    finally:
        os.killpg(leader.pid, signal.SIGKILL)


def test_a_running_engine_whose_wall_clock_start_reads_off_keeps_its_reservation(
    tmp_path: Path,
) -> None:
    """Issue 22's chaos seed 1301: a reservation was released as ``engine-gone`` while its
    engine ran. The ledger compared the wall-clock start within 0.05 s, and psutil's start
    time moves with the whole-second boot time when the clock is adjusted. The bound record
    now keeps the ticks since boot, compared exactly."""
    import psutil

    from hostler.drivers.host_ledger import engine_alive
    from hostler.probes.host import started_since_boot

    me = psutil.Process(os.getpid())
    ticks = started_since_boot(me.pid)
    assert ticks is not None  # Linux: /proc gives them
    off = Held("llamacpp:m:0", GIB, "owner", pid=me.pid, create_time=me.create_time() - 1.0)
    assert not engine_alive(off)  # by the wall clock alone, a second off is another process
    exact = Held(
        "llamacpp:m:0", GIB, "owner", pid=me.pid, create_time=me.create_time() - 1.0,
        since_boot=ticks,
    )  # fmt: skip
    assert engine_alive(exact)
    reused = Held(
        "llamacpp:m:0", GIB, "owner", pid=me.pid, create_time=me.create_time(),
        since_boot=ticks - 5.0,
    )  # fmt: skip
    assert not engine_alive(reused)  # the ticks prove another process holds the pid
