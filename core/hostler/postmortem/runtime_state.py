"""The whole runtime as of a moment (pure): resident engines, reservations, budget, leases, queues.

:func:`fold_rows` folds raw log rows (as :meth:`hostler.store.log.EventStore.read_rows` pages
them) into a :class:`RuntimeState`; :meth:`RuntimeState.to_json` and
:meth:`RuntimeState.from_json` carry it to and from JSON, so that it can be snapshotted and a
later fold can continue from the snapshot (PM3). Nothing here does I/O or reads a clock.

What each part is folded from (PM4):

- engines and leases: the lifecycle models replay folds (:class:`~hostler.replay.WorldFold`,
  the one fold of the ``engine/KEY`` and ``lease/ID`` streams): state, pid and port of each
  engine, each lease while waiting or held; an engine's bytes reserved and measured are
  those of its key's reservation;
- reservations and budget: the host ledger's own state
  (:class:`~hostler.capacity.ledger.LedgerState`, folded by its ``apply`` as the daemon folds
  it): what each reservation holds, the last decision's limits, the operator's
  ``budget_set`` and ``spillover_set``;
- queues: ``queue.*`` per engine (waiting and running request ids); a ``daemon.started``
  empties them, since an earlier daemon's requests died with it;
- sessions: ``router.bound``, the engine each session was last bound to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hostler.capacity.ledger import Decided, Held, LedgerState
from hostler.events.base import UnknownEvent, decode, event_class
from hostler.events.fold import fold_step
from hostler.events.ledger import LedgerDenied
from hostler.machines import Engine, Lease
from hostler.replay import Folded, World, WorldFold

__all__ = ["FOLDS", "STATE_SCHEMA", "RuntimeState", "fold_rows"]

#: Bumped whenever the fold or the JSON form changes: older snapshots are then rebuilt.
STATE_SCHEMA = 1

_UP = frozenset({"starting", "running", "stopping", "adopting"})


@dataclass
class RuntimeState:
    """The runtime as the log describes it after ``last_seq``.

    Attributes:
        last_seq: The seq of the last row folded (0: none).
        events: How many rows were folded.
        engines: Per engine key: ``state``, ``pid``, ``port``, ``reserved`` and ``measured``
            bytes (None when none), ``since`` (seq of its last state change). Stopped engines
            stay listed with their last state.
        ledger: The host ledger's state (``reservations`` and ``budget`` are its views):
            ``explicit`` is the operator's budget (None: automatic), ``spillover`` True, False
            or None (automatic).
        leases: Per lease id, while waiting or held: ``slot``, ``holder``, ``state``,
            ``granted_at``, ``expires_at`` (epoch seconds).
        queues: Per engine key: ``waiting`` and ``running`` request ids, in arrival order.
        sessions: Session id to the engine key it was last bound to.
        unreadable: Seqs of rows of a folded type whose payload did not fit (skipped).
        world: The lifecycle models the engines and leases are views of (not part of the
            JSON form: a snapshot keeps it beside the state).
    """

    last_seq: int = 0
    events: int = 0
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    ledger: LedgerState = field(default_factory=LedgerState)
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    queues: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    sessions: dict[str, str] = field(default_factory=dict)
    unreadable: list[int] = field(default_factory=list)
    world: World = field(default_factory=World, compare=False, repr=False)

    @property
    def reservations(self) -> dict[str, dict[str, Any]]:
        """Per engine key: ``owner``, ``bytes`` held, ``measured`` (None until measured)."""
        return {
            key: {"owner": held.owner, "bytes": held.bytes, "measured": held.measured}
            for key, held in self.ledger.by_key().items()
        }

    @property
    def budget(self) -> dict[str, Any]:
        """The budget in force: the last decision's figures, the operator's settings.

        ``budget``, ``ceiling`` and ``enforced`` as the last ledger decision recorded them;
        ``explicit`` (the operator's budget) and ``spillover`` (None: automatic).
        """
        decided = self.ledger.decided
        return {
            "budget": None if decided is None else decided.budget,
            "ceiling": None if decided is None else decided.ceiling,
            "enforced": None if decided is None else decided.enforced,
            "explicit": self.ledger.explicit_budget,
            "spillover": self.ledger.spillover,
        }

    @property
    def resident(self) -> dict[str, dict[str, Any]]:
        """The engines that are up (starting, running, stopping or being adopted)."""
        return {k: v for k, v in self.engines.items() if v["state"] in _UP}

    @property
    def committed(self) -> int:
        """Bytes every reservation holds together."""
        return self.ledger.committed

    def to_json(self) -> dict[str, Any]:
        """A JSON object holding everything (``schema`` included), for snapshots and ``--json``."""
        return {
            "schema": STATE_SCHEMA,
            "last_seq": self.last_seq,
            "events": self.events,
            "engines": self.engines,
            "reservations": self.reservations,
            "budget": self.budget,
            "ledger": _ledger_to_json(self.ledger),
            "leases": self.leases,
            "queues": self.queues,
            "sessions": self.sessions,
            "unreadable": self.unreadable,
        }

    @classmethod
    def from_json(cls, data: Any) -> RuntimeState:
        """The state :meth:`to_json` wrote.

        Raises:
            ValueError: Not such an object, or of another schema (rebuild it from the log).
        """
        if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
            raise ValueError(f"not a runtime state of schema {STATE_SCHEMA}")
        try:
            state = cls(
                last_seq=_whole(data["last_seq"]),
                events=_whole(data["events"]),
                engines=_objects(data["engines"]),
                ledger=_ledger_from_json(data["ledger"]),
                leases=_objects(data["leases"]),
                queues={
                    str(k): {"waiting": list(v["waiting"]), "running": list(v["running"])}
                    for k, v in data["queues"].items()
                },
                sessions={str(k): str(v) for k, v in data["sessions"].items()},
                unreadable=[_whole(s) for s in data["unreadable"]],
            )
        except (KeyError, TypeError, AttributeError, msgspec.ValidationError) as exc:
            raise ValueError(f"a runtime state with a missing or bad field: {exc}") from None
        return state


def _whole(value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"{value!r} is not a whole number")
    return value


def _ledger_to_json(ledger: LedgerState) -> dict[str, Any]:
    return {
        "reservations": [msgspec.to_builtins(held) for held in ledger.reservations.values()],
        "explicit_budget": ledger.explicit_budget,
        "spillover": ledger.spillover,
        "version": ledger.version,
        "decided": None if ledger.decided is None else msgspec.to_builtins(ledger.decided),
        "budget_source": ledger.budget_source,
    }


def _ledger_from_json(data: Any) -> LedgerState:
    helds = [msgspec.convert(item, Held) for item in data["reservations"]]
    return LedgerState(
        {held.slot: held for held in helds},
        msgspec.convert(data["explicit_budget"], int | None),
        msgspec.convert(data["spillover"], bool | None),
        _whole(data["version"]),
        msgspec.convert(data["decided"], Decided | None),
        msgspec.convert(data.get("budget_source", ""), str),  # absent in older snapshots
    )


def _objects(value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError("expected an object of objects")
    return {str(k): dict(v) for k, v in value.items()}


# -- the fold -------------------------------------------------------------------------------------

Fold = Callable[[RuntimeState, int, str, dict[str, Any]], None]


def _engine(state: RuntimeState, key: str) -> dict[str, Any]:
    found = state.engines.get(key)
    if found is None:
        found = state.engines[key] = {
            "state": "stopped",
            "pid": None,
            "port": None,
            "reserved": None,
            "measured": None,
            "since": 0,
        }
    return found


def _on_engine(state: RuntimeState, seq: int, model: Engine) -> None:
    engine = _engine(state, model.key)
    if model.state != engine["state"]:
        engine["state"], engine["since"] = model.state, seq
    up = model.state in _UP and model.pid is not None
    engine["pid"] = model.pid if up else None
    engine["port"] = (model.identity or {}).get("port") if up else None


def _on_lease(state: RuntimeState, _seq: int, model: Lease) -> None:
    if model.state not in _OPEN:
        state.leases.pop(model.key, None)
        return
    state.leases[model.key] = {
        "slot": model.slot,
        "holder": model.holder,
        "state": model.state,
        "granted_at": model.granted_at,
        "expires_at": model.expires_at,
    }


def _ledger_row(state: RuntimeState, row: Sequence[Any]) -> None:
    """Fold one ledger row into the ledger's state (listed unreadable when it does not fit)."""
    version, schema, raw = row[2], row[4], row[5]
    try:
        payload = _object(raw if isinstance(raw, dict) else _DECODE.decode(raw))
    except (msgspec.DecodeError, TypeError, RecursionError):
        payload = None
    event = None if payload is None or type(schema) is not int else decode(row[3], schema, payload)
    if event is None or event.__class__ is UnknownEvent or type(version) is not int:
        state.unreadable.append(row[0])
        return
    fold_step(state.ledger, version, event)
    key = getattr(event, "key", None)
    if isinstance(key, str) and not isinstance(event, LedgerDenied):  # a denial holds nothing
        engine = _engine(state, key)
        held = state.ledger.by_key().get(key)
        engine["reserved"] = None if held is None else held.reserved
        engine["measured"] = None if held is None else held.measured


def _queue(state: RuntimeState, p: dict[str, Any]) -> tuple[dict[str, list[int]], int]:
    engine = _text(p["engine"])
    number = _int(p["id"])
    found = state.queues.get(engine)
    if found is None:
        found = state.queues[engine] = {"waiting": [], "running": []}
    return found, number


def _on_enqueued(state: RuntimeState, _seq: int, _stream: str, p: dict[str, Any]) -> None:
    queue, number = _queue(state, p)
    queue["waiting"].append(number)


def _on_dispatched(state: RuntimeState, _seq: int, _stream: str, p: dict[str, Any]) -> None:
    queue, number = _queue(state, p)
    _discard(queue["waiting"], number)
    queue["running"].append(number)


def _on_request_ended(state: RuntimeState, _seq: int, _stream: str, p: dict[str, Any]) -> None:
    queue, number = _queue(state, p)
    _discard(queue["waiting"], number)
    _discard(queue["running"], number)
    if not queue["waiting"] and not queue["running"]:
        del state.queues[_text(p["engine"])]


def _on_moved(state: RuntimeState, _seq: int, _stream: str, p: dict[str, Any]) -> None:
    queue, number = _queue(state, p)
    waiting = queue["waiting"]
    other = _int(p["swapped_with"])
    if number in waiting and other in waiting:
        i, j = waiting.index(number), waiting.index(other)
        waiting[i], waiting[j] = other, number


def _on_daemon_started(state: RuntimeState, _seq: int, _stream: str, _p: dict[str, Any]) -> None:
    state.queues.clear()


def _on_bound(state: RuntimeState, _seq: int, _stream: str, p: dict[str, Any]) -> None:
    state.sessions[_text(p["session"])] = _text(p["key"])


def _discard(items: list[int], number: int) -> None:
    if number in items:
        items.remove(number)


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("payload is not a JSON object")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not text")
    return value


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"{value!r} is not a whole number")
    return value


#: The fold of each event type of no lifecycle that the runtime state reads (the ledger's
#: go to its state, the lifecycles' to the world); every other type is passed over.
FOLDS: dict[str, Fold] = {
    "queue.enqueued": _on_enqueued,
    "queue.dispatched": _on_dispatched,
    "queue.released": _on_request_ended,
    "queue.cancelled": _on_request_ended,
    "queue.moved": _on_moved,
    "daemon.started": _on_daemon_started,
    "router.bound": _on_bound,
}

_OPEN = frozenset({"waiting", "held"})
_VIEWS: dict[type[Any], Callable[[RuntimeState, int, Any], None]] = {
    Engine: _on_engine,
    Lease: _on_lease,
}
#: The lifecycle each engine and lease event type belongs to.
_LIFECYCLE_OF: dict[str, type[Any]] = {
    cls.TYPE: model for model in _VIEWS for cls in model.SPEC.event_types
}
_DECODE = msgspec.json.Decoder()


def fold_rows(state: RuntimeState, rows: Iterable[Sequence[Any]]) -> RuntimeState:
    """Fold raw rows ``(seq, stream_id, version, type, schema_version, payload)`` into ``state``.

    ``payload`` is JSON text (or an already decoded object). Rows of other types only move
    ``last_seq``; a row of a folded type whose payload is not a fitting JSON object is listed in
    ``unreadable`` and skipped, never stopping the fold. Returns ``state``.
    """
    folds = FOLDS
    json_decode = _DECODE.decode
    row_of_world = WorldFold(state.world).row
    for row in rows:
        seq, stream, type_name, raw = row[0], row[1], row[3], row[5]
        state.last_seq = seq
        state.events += 1
        folded = row_of_world(seq, stream, row[2], type_name, row[4], raw)
        if folded is not Folded.OTHER:
            _lifecycle_row(state, row, folded)
            continue
        if type_name in _LIFECYCLE_OF:  # a lifecycle's event on a stream of none
            state.unreadable.append(seq)
            continue
        fold = folds.get(type_name)
        if fold is None:
            if type_name.startswith("ledger.") and event_class(type_name) is not None:
                _ledger_row(state, row)
            continue
        try:
            payload = raw if isinstance(raw, dict) else json_decode(raw)
            fold(state, seq, stream, _object(payload))
        except (msgspec.DecodeError, TypeError, KeyError, ValueError, AttributeError):
            state.unreadable.append(seq)
        except RecursionError:  # nested past the decoder's depth
            state.unreadable.append(seq)
    return state


def _lifecycle_row(state: RuntimeState, row: Sequence[Any], folded: Folded) -> None:
    """Refresh the view of the engine or lease whose row the world just folded."""
    seq, stream = row[0], row[1]
    lifecycle = _LIFECYCLE_OF.get(row[3])
    if lifecycle is None:
        return  # of another lifecycle, or of none: not the runtime's
    prefix = lifecycle.STREAM_PREFIX
    if folded is not Folded.APPLIED or not stream.startswith(prefix):
        state.unreadable.append(seq)
        return
    _VIEWS[lifecycle](state, seq, state.world.models[lifecycle][stream.removeprefix(prefix)])
