"""Shared machinery of hostler's lifecycle machines (pure: no I/O, no clock).

Each lifecycle (engine, GPU lease, memory reservation) is one shared, synchronous
``transitions.Machine``; every instance (one engine, one lease) is a model bound to it with
``add_model``. Firing a trigger:

1. checks it is legal in the current state (an illegal one raises
   :class:`~hostler.errors.IllegalTransitionError` and changes nothing);
2. builds the trigger's event from the observation passed in (a wrong observation raises
   before the state changes);
3. changes state, folds the event into the model with the same :meth:`LifecycleModel.apply`
   that replay uses, and appends it to ``pending``.

Persisting ``pending`` is the store's job (:mod:`hostler.replay`). Because live firing and
replay run the same fold, a replayed model equals the live one field for field.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from transitions import EventData, Machine, MachineError

from hostler.errors import IllegalTransitionError, UsageError
from hostler.events.base import Event

__all__ = ["LifecycleModel", "LifecycleSpec", "Step", "TransitionEvent"]


class _QuietOverridePolicy(logging.Filter):
    """Drop transitions' per-model "Skip binding" notes.

    With ``model_override=True`` we bind only the declared stubs on purpose; one note per
    trigger per engine would be noise in a host application's logs.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "Skip binding of" not in str(record.msg)


logging.getLogger("transitions.core").addFilter(_QuietOverridePolicy())
# Quiet by default: hostler says what each transition did itself (its events, its own log
# lines); the library's per-callback "Executed callback" notes are INFO noise in a daemon's
# or a host program's output. A level set on it explicitly (for debugging) is left alone.
if logging.getLogger("transitions").level == logging.NOTSET:
    logging.getLogger("transitions").setLevel(logging.WARNING)


@dataclass(frozen=True, slots=True)
class TransitionEvent(Event):
    """Base of every lifecycle event: the move it made and when it was observed.

    Attributes:
        from_state: The state before (empty for a creation event).
        to_state: The state after (equal to ``from_state`` for an internal transition).
        at: Observation time in seconds since the epoch, from the driver's injected clock.
    """

    from_state: str
    to_state: str
    at: float


@dataclass(frozen=True, slots=True)
class Step:
    """One transition of a lifecycle: a trigger, its sources, its destination and its event.

    ``dest=None`` makes an internal transition (state unchanged, event still recorded).
    """

    trigger: str
    sources: tuple[StrEnum, ...]
    dest: StrEnum | None
    event: type[TransitionEvent]


class LifecycleSpec:
    """A lifecycle's states and steps, and the one shared machine that enforces them."""

    def __init__(
        self, name: str, states: type[StrEnum], initial: StrEnum, steps: Sequence[Step]
    ) -> None:
        self.name = name
        self.states = states
        self.initial = initial
        self.steps = tuple(steps)
        self.event_for: dict[str, type[TransitionEvent]] = {}
        for step in self.steps:
            known = self.event_for.setdefault(step.trigger, step.event)
            if known is not step.event:
                raise ValueError(f"{name}: trigger {step.trigger!r} maps to two event types")
        self.event_types = frozenset(self.event_for.values())
        self.machine = Machine(
            model=None,
            states=[s.value for s in states],
            transitions=[
                {
                    "trigger": s.trigger,
                    "source": [src.value for src in s.sources],
                    "dest": None if s.dest is None else s.dest.value,
                }
                for s in self.steps
            ],
            initial=None,
            auto_transitions=False,
            send_event=True,
            model_override=True,
            before_state_change="_stage",
            after_state_change="_record",
        )
        self.triggers_from: dict[str, tuple[str, ...]] = {
            state.value: tuple(sorted({s.trigger for s in self.steps if state in s.sources}))
            for state in states
        }

    def legal_triggers(self, state: str) -> tuple[str, ...]:
        """Triggers allowed in ``state``, sorted."""
        return self.triggers_from.get(state, ())


class LifecycleModel:
    """Base of one lifecycle instance. Subclasses set ``SPEC`` and fold their own fields.

    Attributes:
        key: The instance's identity (engine key, lease id, ...); its stream is
            ``f"{STREAM_PREFIX}{key}"``.
        state: The current state's value.
        version: The stream version of the last *persisted* event.
        pending: Events fired but not yet persisted, oldest first.
        changed_at: Observation time of the last event (None before any).
    """

    SPEC: ClassVar[LifecycleSpec]
    STREAM_PREFIX: ClassVar[str]
    _FOLDS: ClassVar[Mapping[type[Event], Callable[[Any, Any], None]]] = {}

    # Declared for model_override=True: transitions replaces these stubs when binding.
    def trigger(self, name: str, **observation: Any) -> bool:  # pragma: no cover - stub
        """Fire ``name`` (replaced by transitions on binding)."""
        raise NotImplementedError

    def may_trigger(self, name: str, **observation: Any) -> bool:  # pragma: no cover - stub
        """Whether ``name`` may fire (replaced by transitions on binding)."""
        raise NotImplementedError

    def __init__(self, key: str) -> None:
        self.key = key
        self.state: str = self.SPEC.initial.value
        self.version = 0
        self.pending: list[TransitionEvent] = []
        self.changed_at: float | None = None
        self._bound = False
        self._staged: TransitionEvent | None = None

    @property
    def stream_id(self) -> str:
        """The log stream that holds this instance's events."""
        return f"{self.STREAM_PREFIX}{self.key}"

    # -- live ------------------------------------------------------------------------------

    def fire(self, trigger: str, **observation: Any) -> TransitionEvent:
        """Fire a trigger with its observation; return the event recorded in ``pending``.

        Raises:
            IllegalTransitionError: The trigger is not allowed in the current state.
            UsageError: The observation does not fit the trigger's event.
        """
        spec = self.SPEC
        if trigger not in spec.event_for or trigger not in spec.legal_triggers(self.state):
            raise IllegalTransitionError(
                spec.name, self.key, self.state, trigger, list(spec.legal_triggers(self.state))
            )
        if not self._bound:
            spec.machine.add_model(self, initial=self.state)
            self._bound = True
        try:
            self.trigger(trigger, **observation)
        except MachineError as exc:  # pragma: no cover - legality is checked above
            raise IllegalTransitionError(
                spec.name, self.key, self.state, trigger, list(spec.legal_triggers(self.state))
            ) from exc
        event = self.pending[-1]
        return event

    def unbind(self) -> None:
        """Detach from the shared machine (it holds strong references to bound models)."""
        if self._bound:
            self.SPEC.machine.remove_model(self)
            self._bound = False

    def _stage(self, data: EventData) -> None:
        event_cls = self.SPEC.event_for[data.event.name]
        transition = data.transition
        assert transition is not None  # noqa: S101 - transitions always passes it here
        dest, source = transition.dest, transition.source
        try:
            self._staged = event_cls(
                from_state=source,
                to_state=source if dest is None else dest,
                **data.kwargs,
            )
        except TypeError as exc:
            expected = [
                f.name
                for f in dataclasses.fields(event_cls)
                if f.name not in {"from_state", "to_state"}
            ]
            raise UsageError(
                f"{self.SPEC.name} {self.key!r}: trigger {data.event.name!r} takes the "
                f"observation fields {expected}, got {sorted(data.kwargs)} ({exc})"
            ) from exc

    def _record(self, _data: EventData) -> None:
        event, self._staged = self._staged, None
        assert event is not None  # noqa: S101 - _stage always runs first
        self.apply(event)
        self.pending.append(event)

    # -- fold (live and replay) ---------------------------------------------------------------

    def apply(self, event: TransitionEvent) -> None:
        """Fold one event of this lifecycle into the model (used live and by replay)."""
        self.state = event.to_state
        self.changed_at = event.at
        fold = self._FOLDS.get(event.__class__)
        if fold is not None:
            fold(self, event)

    def snapshot(self) -> dict[str, Any]:
        """Every folded field, for comparing a replayed model with a live one."""
        skip = {"pending", "_bound", "_staged", "trigger", "may_trigger"}
        return {k: v for k, v in vars(self).items() if k not in skip and not callable(v)}

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Put back the folded fields of an earlier :meth:`snapshot` (pending is untouched).

        For a decision the log refused: the model returns to where it was before it fired.
        The caller hands over a deep copy taken before firing (folds may mutate in place).
        """
        vars(self).update(snapshot)
