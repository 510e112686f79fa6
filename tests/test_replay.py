"""Replay: random legal histories, run live on a real SQLite file, rebuilt in a new process."""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostler import (
    Engine,
    EventStore,
    Lease,
    LifecycleModel,
    Reservation,
    UnknownEvent,
    commit,
    load,
    replay,
)
from hostler.machines.base import TransitionEvent

from _support import Note, insert_raw, run_python

KINDS: tuple[type[LifecycleModel], ...] = (Engine, Lease, Reservation)
_text = st.text(max_size=12)
_int = st.integers(min_value=-(2**31), max_value=2**53)
_float = st.floats(allow_nan=False, allow_infinity=False)
_BY_HINT: dict[Any, st.SearchStrategy[Any]] = {
    int: _int,
    float: _float,
    str: _text,
    bool: st.booleans(),
}


def _strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    if typing.get_origin(hint) is dict:  # a decision's inputs: JSON-shaped values
        scalar = st.one_of(st.none(), st.booleans(), _int, _float, _text)
        return st.dictionaries(_text, st.one_of(scalar, st.lists(scalar, max_size=3)), max_size=4)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return st.one_of(*(_strategy_for(arg) for arg in typing.get_args(hint)))
    if hint is type(None):
        return st.none()
    return _BY_HINT[hint]


def observation(event_cls: type[TransitionEvent]) -> st.SearchStrategy[dict[str, Any]]:
    """Random observation fields for one event type (all but from/to state and time)."""
    hints = typing.get_type_hints(event_cls)
    fields = {
        name: _strategy_for(hints[name])
        for name in event_cls._FIELDS
        if name not in {"from_state", "to_state", "at"}
    }
    return st.fixed_dictionaries(fields)


def live_snapshot(models: list[LifecycleModel]) -> dict[str, dict[str, dict[str, Any]]]:
    """What replay must rebuild: every model that has persisted events."""
    out: dict[str, dict[str, dict[str, Any]]] = {cls.__name__: {} for cls in KINDS}
    for model in sorted(models, key=lambda m: m.key):
        if model.version:
            out[type(model).__name__][model.key] = model.snapshot()
    return normalized(out)


def normalized(snapshot: Any) -> dict[str, Any]:
    return typing.cast(dict[str, Any], json.loads(json.dumps(snapshot)))


REPLAY_IN_NEW_PROCESS = """
import json, sys
from hostler import EventStore, replay
out = {}
for path in sys.argv[1:]:
    with EventStore.open(path) as store:
        world = replay(store)
        out[path] = {"snapshot": world.snapshot(), "events": world.events, "count": store.count()}
print(json.dumps(out))
"""


def test_random_histories_replay_identically_in_a_new_process() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="hostler-replay-"))
    finished: list[tuple[str, dict[str, Any], int]] = []
    counter = itertools.count()

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def history(data: st.DataObject) -> None:
        path = workdir / f"log{next(counter)}.db"
        kinds = data.draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=12))
        models = [cls(f"{cls.__name__.lower()}-{i}") for i, cls in enumerate(kinds)]
        fired = 0
        at = 1_700_000_000.0
        checkpoints: list[tuple[int, dict[str, Any]]] = []
        with EventStore.open(path, owner=True) as store:
            for _ in range(data.draw(st.integers(1, 150))):
                model = data.draw(st.sampled_from(models))
                legal = model.SPEC.legal_triggers(model.state)
                if not legal:
                    continue
                trigger = data.draw(st.sampled_from(legal))
                at += data.draw(st.floats(0, 600))
                fields = data.draw(observation(model.SPEC.event_for[trigger]))
                model.fire(trigger, at=at, **fields)
                fired += 1
                choice = data.draw(st.integers(0, 9))
                if choice < 4:
                    commit(store, model)
                elif choice == 9:
                    for each in models:
                        commit(store, each)
                    checkpoints.append((store.last_seq(), live_snapshot(models)))
            for each in models:
                commit(store, each)
            final = live_snapshot(models)
            # in-process replay: the whole log, and the log as of each checkpoint
            world = replay(store)
            assert normalized(world.snapshot()) == final
            assert world.events == fired == store.count()
            for seq, expected in checkpoints:
                assert normalized(replay(store, until_seq=seq).snapshot()) == expected
            for model in models:
                if model.version:
                    again = load(store, type(model), model.key)
                    assert normalized(again.snapshot()) == normalized(model.snapshot())
                model.unbind()
        finished.append((str(path), final, fired))

    try:
        history()
        assert len(finished) >= 30
        result = run_python(REPLAY_IN_NEW_PROCESS, *(path for path, _, _ in finished), timeout=300)
        assert result.returncode == 0, result.stderr
        replayed = json.loads(result.stdout)
        for path, expected, fired in finished:
            assert replayed[path]["snapshot"] == expected, path
            assert replayed[path]["events"] == replayed[path]["count"] == fired, path
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_replay_until_time_gives_state_as_of_that_moment(store: EventStore) -> None:
    from datetime import UTC, datetime, timedelta

    ticks = iter(datetime(2026, 3, 1, 14, 0, tzinfo=UTC) + timedelta(minutes=m) for m in range(50))
    timed = EventStore(store._engines, name=store.name, lock=None, clock=lambda: next(ticks))
    engine = Engine("llamacpp:70b:0")
    engine.fire("start", at=1.0, cause="request")
    commit(timed, engine)  # 14:00
    engine.fire(
        "spawned",
        at=1.1,
        pid=7,
        create_time=1.0,
        boot_id="b",
        launch_token="t",
        argv_fingerprint="f",
        port=1,
    )
    engine.fire("ready", at=2.0)
    commit(timed, engine)  # 14:01
    engine.fire("stop", at=3.0, reason="memory-pressure")
    commit(timed, engine)  # 14:02
    as_of = replay(store, until=datetime(2026, 3, 1, 14, 1, 30, tzinfo=UTC))
    assert as_of.engines["llamacpp:70b:0"].state == "running"
    now = replay(store)
    assert now.engines["llamacpp:70b:0"].state == "stopping"
    assert now.engines["llamacpp:70b:0"].stop_reason == "memory-pressure"


def test_replay_keeps_unknown_and_foreign_events_without_failing(
    store: EventStore, log_target: str
) -> None:
    engine = Engine("e:1:0")
    engine.fire("start", at=1.0, cause="request")
    commit(store, engine)
    store.append("device/host", [Note("sample")], expected_version=0)
    insert_raw(log_target, "engine/e:1:0", 2, "engine.future_thing", "{}")
    world = replay(store)
    assert world.engines["e:1:0"].state == "starting"
    # the unknown event is not folded, but the stream is at version 2: what an append expects
    assert world.engines["e:1:0"].version == 2
    assert world.other == 1 and len(world.unknown) == 1
    assert world.events == 3


def test_commit_conflict_keeps_pending_and_reload_recovers(store: EventStore) -> None:
    from hostler import ConcurrencyError

    first = Engine("e:1:0")
    first.fire("start", at=1.0, cause="request")
    commit(store, first)
    stale = load(store, Engine, "e:1:0")
    first.fire("stop", at=2.0, reason="user")
    commit(store, first)
    stale.fire(
        "spawned",
        at=2.0,
        pid=1,
        create_time=1.0,
        boot_id="b",
        launch_token="t",
        argv_fingerprint="f",
        port=1,
    )
    with pytest.raises(ConcurrencyError):
        commit(store, stale)
    assert len(stale.pending) == 1
    fresh = load(store, Engine, "e:1:0")
    assert fresh.state == "stopping" and fresh.version == 2
    assert not any(isinstance(r.event, UnknownEvent) for r in store.read_all())


def test_a_v1_engine_crash_is_upcast_on_read(store: EventStore, log_target: str) -> None:
    from hostler.machines.engine import EngineCrashed

    v1 = {
        "from_state": "running",
        "to_state": "backoff",
        "at": 5.0,
        "exit_code": None,
        "signal": 9,
        "reached_ready": True,
        "retry_at": 6.0,
    }
    insert_raw(log_target, "engine/e:1:0", 1, "engine.crashed", json.dumps(v1))
    (record,) = store.read_stream("engine/e:1:0")
    assert record.schema_version == 1
    assert isinstance(record.event, EngineCrashed)
    assert record.event.output_tail == ""
    assert record.event.signal == 9


def _insert_raw(log_target: str, stream: str, version: int, type_name: str, payload: str) -> None:
    insert_raw(log_target, stream, version, type_name, payload)


def test_replay_and_load_fold_a_stream_with_unfoldable_events_alike(
    store: EventStore, log_target: str
) -> None:
    """One fold: the version is the stream position whatever the last event; state agrees."""
    engine = Engine("e:1:0")
    engine.fire("start", at=1.0, cause="request")
    engine.fire(
        "spawned",
        at=1.5,
        pid=7,
        create_time=1.0,
        boot_id="b",
        launch_token="t",
        argv_fingerprint="f",
        port=9,
    )
    commit(store, engine)  # v1, v2
    _insert_raw(log_target, "engine/e:1:0", 3, "engine.future_thing", "{}")  # unknown type
    store.append("engine/e:1:0", [Note("not an engine event")], expected_version=3)  # foreign
    world = replay(store)
    loaded = load(store, Engine, "e:1:0")
    replayed = world.engines["e:1:0"]
    assert replayed.version == loaded.version == 4
    assert replayed.snapshot() == loaded.snapshot()
    assert loaded.state == "starting" and loaded.pid == 7
    assert world.unknown == [3, 4]
    # the version is what the next append must expect: both can commit straight away
    replayed.fire("ready", at=2.0)
    assert commit(store, replayed) is not None
    assert load(store, Engine, "e:1:0").state == "running"


def test_a_wrongly_typed_payload_is_unknown_in_replay_and_load(
    store: EventStore, log_target: str
) -> None:
    engine = Engine("e:1:0")
    engine.fire("start", at=1.0, cause="request")
    commit(store, engine)
    # engine.stop_requested's `at` must be a number: this one does not fit its class
    _insert_raw(
        log_target,
        "engine/e:1:0",
        2,
        "engine.stop_requested",
        '{"from_state": "starting", "to_state": "stopping", "at": "soon", "reason": "user"}',
    )
    (_, record) = store.read_stream("engine/e:1:0")
    assert isinstance(record.event, UnknownEvent)
    assert "does not fit" in record.event.reason
    assert record.event.payload["at"] == "soon"
    world = replay(store)
    loaded = load(store, Engine, "e:1:0")
    for model in (world.engines["e:1:0"], loaded):
        assert model.state == "starting"
        assert model.changed_at == 1.0
        assert model.version == 2
    assert world.unknown == [2]


def test_an_old_schema_is_upcast_by_replay_too(store: EventStore, log_target: str) -> None:
    engine = Engine("e:1:0")
    engine.fire("start", at=1.0, cause="request")
    engine.fire(
        "spawned",
        at=1.5,
        pid=7,
        create_time=1.0,
        boot_id="b",
        launch_token="t",
        argv_fingerprint="f",
        port=9,
    )
    engine.fire("ready", at=2.0)
    commit(store, engine)
    v1 = {
        "from_state": "running",
        "to_state": "backoff",
        "at": 5.0,
        "exit_code": None,
        "signal": 9,
        "reached_ready": True,
        "retry_at": 6.0,
    }
    _insert_raw(log_target, "engine/e:1:0", 4, "engine.crashed", json.dumps(v1))
    world = replay(store)
    replayed = world.engines["e:1:0"]
    assert world.unknown == []
    assert replayed.state == "backoff" and replayed.version == 4
    assert replayed.snapshot() == load(store, Engine, "e:1:0").snapshot()


def test_read_stream_and_replay_decode_a_payload_with_an_extra_field_alike(
    store: EventStore, log_target: str
) -> None:
    _insert_raw(
        log_target,
        "engine/e:1:0",
        1,
        "engine.start_requested",
        '{"from_state": "stopped", "to_state": "starting", "at": 1.0, "cause": "request", "later": 1}',
    )
    (record,) = store.read_stream("engine/e:1:0")
    assert not isinstance(record.event, UnknownEvent)
    world = replay(store)
    assert world.unknown == []
    assert world.engines["e:1:0"].state == "starting"
    assert world.engines["e:1:0"].snapshot() == load(store, Engine, "e:1:0").snapshot()
