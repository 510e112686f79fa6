# mypy: disable-error-code="unreachable"
# (a test asserts a state, fires a trigger, then asserts another: mypy cannot see the change)
"""The lifecycle machines: legal moves, refused moves, recorded events, purity."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hostler import (
    Engine,
    EngineState,
    IllegalTransitionError,
    Lease,
    LeaseState,
    Reservation,
    ReservationState,
    StopReason,
    UsageError,
    registered_types,
)
from hostler.machines import LIFECYCLES
from hostler.machines.engine import (
    MADE_ROOM_RULE,
    EngineCrashed,
    EngineSpawned,
    EngineStopRequested,
    made_room,
)

from _support import PURE_CAPACITY_NAMES

SPAWN = {
    "pid": 4242,
    "create_time": 100.5,
    "boot_id": "boot-1",
    "launch_token": "tok",
    "argv_fingerprint": "sha256:abc",
    "port": 40000,
}


def _running_engine() -> Engine:
    engine = Engine("llamacpp:m:0")
    engine.fire("start", at=1.0, cause="request")
    engine.fire("spawned", at=1.1, **SPAWN)
    engine.fire("ready", at=2.0)
    return engine


def test_engine_happy_path_records_each_transition_with_its_observation() -> None:
    engine = _running_engine()
    assert engine.state == EngineState.RUNNING
    assert [type(e).TYPE for e in engine.pending] == [
        "engine.start_requested",
        "engine.spawned",
        "engine.ready",
    ]
    spawned = engine.pending[1]
    assert isinstance(spawned, EngineSpawned)
    assert (spawned.from_state, spawned.to_state) == ("starting", "starting")  # internal
    assert spawned.pid == 4242 and engine.pid == 4242
    assert engine.identity is not None and engine.identity["launch_token"] == "tok"
    engine.fire("stop", at=9.0, reason=StopReason.IDLE)
    engine.fire("exited", at=9.5, exit_code=0, signal=None)
    assert engine.state == EngineState.STOPPED
    assert engine.stop_reason == "idle" and engine.pid is None
    assert engine.changed_at == 9.5


def test_only_an_eviction_by_pp4_made_room() -> None:
    """The one predicate the post-mortem's figures, timeline and tests ask (PP4, PM23, PM31)."""
    assert MADE_ROOM_RULE == "PP4"
    assert made_room("evicted", {"rule": "PP4", "for": "k:b:0"})
    assert made_room(StopReason.EVICTED, {"rule": "PP4"})  # the enum and its value alike
    # unloads someone asked for: a lease's slot swap, a person, a retire, a reconcile
    for rule in ("GA1", "PP6", "PP9", "PP10", "pp4", "PP4 ", " PP4", "PP4x", "", None, 4):
        assert not made_room("evicted", {"rule": rule}), rule
    assert not made_room("evicted", {})
    # a decision absent or damaged (not a mapping) is never one
    for decision in (None, "PP4", ["PP4"], 4):
        assert not made_room("evicted", decision), decision
    # the rule is PP4's, but the reason is not an eviction
    for reason in ("idle", "user", "shutdown", "Evicted", "", None):
        assert not made_room(reason, {"rule": "PP4"}), reason
    # the typed event asks the same question of its own fields
    room = EngineStopRequested("running", "stopping", 0.0, "evicted", {"rule": "PP4"})
    swap = EngineStopRequested("running", "stopping", 0.0, "evicted", {"rule": "GA1"})
    bare = EngineStopRequested("running", "stopping", 0.0, "evicted")
    idle = EngineStopRequested("running", "stopping", 0.0, "idle", {"rule": "PP4"})
    assert (room.made_room, swap.made_room, bare.made_room, idle.made_room) == (
        True,
        False,
        False,
        False,
    )


def test_crash_backoff_restart_and_fatal() -> None:
    engine = _running_engine()
    event = engine.fire(
        "crashed", at=3.0, exit_code=None, signal=9, reached_ready=True, retry_at=4.0
    )
    assert isinstance(event, EngineCrashed)
    assert engine.state == EngineState.BACKOFF and engine.retry_at == 4.0
    assert engine.crashes == 1 and engine.stop_reason == StopReason.CRASHED
    engine.fire("start", at=4.0, cause="restart")
    engine.fire("failed", at=4.1, error="restart budget spent", retry_at=64.1)
    assert engine.state == EngineState.FATAL and engine.last_error == "restart budget spent"
    with pytest.raises(IllegalTransitionError):
        engine.fire("start", at=5.0, cause="request")
    engine.fire("reset", at=65.0, cause="lock-out expired")
    assert engine.state == EngineState.STOPPED and engine.retry_at is None
    assert engine.starts == 2


def test_stop_from_backoff_goes_straight_to_stopped() -> None:
    engine = _running_engine()
    engine.fire("crashed", at=3.0, exit_code=1, signal=None, reached_ready=True, retry_at=4.0)
    engine.fire("stop", at=3.5, reason=StopReason.USER)
    assert engine.state == EngineState.STOPPED and engine.stop_reason == "user"


def test_adoption_paths() -> None:
    adopted = _running_engine()
    adopted.fire("begin_adoption", at=10.0, daemon_pid=99)
    assert adopted.state == EngineState.ADOPTING
    adopted.fire("adopted", at=10.2, pid=4242)
    assert adopted.state == EngineState.RUNNING and adopted.pid == 4242
    lost = _running_engine()
    lost.fire("begin_adoption", at=10.0, daemon_pid=99)
    lost.fire("lost", at=10.1, cause="pid 4242 gone")
    assert (
        lost.state == EngineState.STOPPED
        and lost.stop_reason == StopReason.LOST
        and lost.pid is None
    )


def test_illegal_trigger_names_machine_state_and_trigger_and_changes_nothing() -> None:
    engine = _running_engine()
    before = (engine.state, len(engine.pending), engine.snapshot())
    with pytest.raises(IllegalTransitionError) as caught:
        engine.fire("ready", at=3.0)
    error = caught.value
    assert error.code == "machine.illegal-transition"
    assert (error.machine, error.key, error.state, error.trigger) == (
        "engine",
        "llamacpp:m:0",
        "running",
        "ready",
    )
    assert "begin_adoption, crashed, failed, stop" in str(error)
    with pytest.raises(IllegalTransitionError, match="'fly'"):
        engine.fire("fly", at=3.0)
    assert (engine.state, len(engine.pending), engine.snapshot()) == before


def test_a_wrong_observation_is_refused_before_the_state_changes() -> None:
    engine = _running_engine()
    before = (engine.state, len(engine.pending))
    with pytest.raises(
        UsageError, match=r"'stop' takes the observation fields \['at', 'reason', 'decision'\]"
    ):
        engine.fire("stop", at=3.0)
    with pytest.raises(UsageError):
        engine.fire("stop", at=3.0, reason="idle", extra=1)
    assert (engine.state, len(engine.pending)) == before
    engine.fire("stop", at=3.0, reason=StopReason.USER)  # the machine still works
    assert engine.state == EngineState.STOPPING


def test_lease_lifecycle() -> None:
    lease = Lease("l1")
    assert lease.state == LeaseState.NEW
    lease.fire("request", at=1.0, slot="image", holder="sdcpp:flux:0")
    lease.fire("grant", at=1.5, expires_at=31.5)
    assert (lease.state, lease.slot, lease.holder, lease.expires_at) == (
        "held",
        "image",
        "sdcpp:flux:0",
        31.5,
    )
    lease.fire("expire", at=40.0, reason="stale", stale_for=8.5)
    assert lease.state == LeaseState.BROKEN and lease.end_cause == "stale"
    with pytest.raises(IllegalTransitionError):
        lease.fire("release", at=41.0, cause="late")
    waiting = Lease("l2")
    waiting.fire("request", at=1.0, slot="llm", holder="x")
    waiting.fire("release", at=2.0, cause="gave up")
    assert waiting.state == LeaseState.RELEASED


def test_reservation_lifecycle() -> None:
    res = Reservation("llamacpp:m:0")
    res.fire("request", at=1.0, bytes=10, owner="d1")
    res.fire("deny", at=1.0, shortfall=4, reason="budget", budget=100, committed_other=94)
    assert res.state == ReservationState.DENIED and res.shortfall == 4 and res.granted_bytes == 0
    res.fire("request", at=2.0, bytes=5, owner="d1")
    assert res.shortfall is None
    res.fire("grant", at=2.0, bytes=5, budget=100, committed_other=94)
    assert res.state == ReservationState.GRANTED and res.granted_bytes == 5
    with pytest.raises(IllegalTransitionError):
        res.fire("request", at=3.0, bytes=6, owner="d1")
    res.fire("release", at=4.0, cause="engine stopped")
    assert res.granted_bytes == 0 and res.state == ReservationState.RELEASED


def test_many_models_share_one_machine_and_do_not_interfere() -> None:
    engines = [Engine(f"e:{i}:0") for i in range(50)]
    for i, engine in enumerate(engines):
        if i % 2:
            engine.fire("start", at=1.0, cause="request")
    assert sum(e.state == EngineState.STARTING for e in engines) == 25
    assert len({id(e.SPEC.machine) for e in engines}) == 1
    for engine in engines:
        engine.unbind()


def test_event_type_names_are_stable() -> None:
    """These strings are in people's logs: renaming one breaks every replay of them."""
    lifecycle_types = {
        name
        for name in registered_types()
        if name.split(".")[0] in {"engine", "lease", "reservation"}
    }
    assert lifecycle_types == {
        "engine.start_requested",
        "engine.spawned",
        "engine.ready",
        "engine.stop_requested",
        "engine.stopped",
        "engine.stop_failed",
        "engine.crashed",
        "engine.failed",
        "engine.reset",
        "engine.adoption_started",
        "engine.adopted",
        "engine.lost",
        "lease.requested",
        "lease.granted",
        "lease.released",
        "lease.broken",
        "reservation.requested",
        "reservation.granted",
        "reservation.denied",
        "reservation.released",
    }
    for name, cls in registered_types().items():
        assert "hostler" not in name and ":" not in name  # never an import path
        assert name == cls.TYPE


def test_every_state_is_reachable_and_every_trigger_has_an_event() -> None:
    for cls in LIFECYCLES:
        spec = cls.SPEC
        reachable = {spec.initial.value}
        frontier = [spec.initial.value]
        while frontier:
            state = frontier.pop()
            for step in spec.steps:
                if state in {s.value for s in step.sources}:
                    dest = state if step.dest is None else step.dest.value
                    if dest not in reachable:
                        reachable.add(dest)
                        frontier.append(dest)
        assert reachable == {s.value for s in spec.states}, spec.name


CORE = Path(__file__).resolve().parent.parent / "core" / "hostler"
PURE_CAPACITY = tuple(f"capacity/{name}.py" for name in PURE_CAPACITY_NAMES)
PURE_PACKAGES = ("machines/*.py", "events/*.py", "policies/*.py", "untrusted.py", *PURE_CAPACITY)
ALLOWED_IMPORTS = {
    "__future__",
    "collections",
    "copy",
    "dataclasses",
    "enum",
    "math",
    "re",
    "statistics",
    "logging",
    "typing",
    "transitions",
    "hashlib",  # a digest of text in memory (a long model id's suffix): no I/O, no clock
    "msgspec",  # typed JSON decoding of event payloads: in memory, no I/O, no clock
    "json",  # parsing text already in memory (hostler.untrusted); open() stays forbidden
    "hostler",
}
PURE_HOSTLER_MODULES = (
    "hostler.errors",
    "hostler.untrusted",  # pure: bounded JSON and whole numbers (no I/O)
    "hostler.events",
    "hostler.machines",
    "hostler.policies",
    *(f"hostler.{path[:-3].replace('/', '.')}" for path in PURE_CAPACITY),
)
FORBIDDEN_CALLS = {"time", "monotonic", "now", "utcnow", "perf_counter", "open", "sleep"}


@pytest.mark.parametrize("pattern", PURE_PACKAGES)
def test_the_pure_core_does_no_io_and_reads_no_clock(pattern: str) -> None:
    paths = sorted(CORE.glob(pattern))
    assert paths, pattern
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    assert name not in FORBIDDEN_CALLS, f"{path.name}: calls {name}()"
                continue
            for name in names:
                root = name.split(".")[0]
                assert root in ALLOWED_IMPORTS, f"{path.name} imports {name}"
                if root == "hostler":
                    assert name.startswith(PURE_HOSTLER_MODULES), f"{path.name} imports {name}"
