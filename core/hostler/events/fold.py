"""The one fold: how every reader of the log turns a stream's records into state (pure).

Replay, :func:`~hostler.replay.load`, the host ledger's catch-up and the calibration reader all
fold through :func:`fold_step`, so they agree on what a record does:

* the target's ``version`` always moves to the record's version: it is the stream position the
  state reflects, the one an optimistic-concurrency append must expect, whatever the event;
* an event is applied only when it is known (not an :class:`~hostler.events.base.UnknownEvent`)
  and belongs to the target (its class is in ``accepts``, when given); any other is counted
  and listed by seq, never applied.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from hostler.events.base import Event, UnknownEvent

__all__ = ["FoldReport", "Foldable", "Record", "fold", "fold_step"]


class Record(Protocol):
    """A stored event as folds read it (:class:`~hostler.store.log.RecordedEvent` is one)."""

    @property
    def seq(self) -> int:
        """Global position in the log."""

    @property
    def version(self) -> int:
        """Position within the stream."""

    @property
    def event(self) -> Event | UnknownEvent:
        """The decoded event."""


class Foldable(Protocol):
    """State built by folding one stream: a version and an ``apply`` for one event."""

    version: int

    def apply(self, event: Any) -> None:
        """Fold one event into the state."""


F = TypeVar("F", bound=Foldable)


@dataclass
class FoldReport:
    """What a fold did.

    Attributes:
        applied: How many events were applied.
        skipped: Seqs of the records that were not applied: of an unknown type (or schema, or a
            payload that no longer fits), or not belonging to the target.
    """

    applied: int = 0
    skipped: list[int] = field(default_factory=list)


def fold_step(
    target: Foldable,
    version: int,
    event: Event | UnknownEvent,
    accepts: Collection[type[Event]] | None = None,
) -> bool:
    """Fold one record into ``target``; return whether its event was applied.

    The event is applied when it is known and (with ``accepts``) of an accepted class; either
    way ``target.version`` becomes ``version``.
    """
    cls = event.__class__
    if cls is UnknownEvent or (accepts is not None and cls not in accepts):
        target.version = version
        return False
    target.apply(event)
    target.version = version
    return True


def fold(
    target: F,
    records: Iterable[Record],
    *,
    accepts: Collection[type[Event]] | None = None,
    report: FoldReport | None = None,
) -> F:
    """Fold one stream's records, in version order, into ``target``; return ``target``.

    Records at or below ``target.version`` are already in it and are passed over, so a state
    can be caught up with any overlapping read. ``accepts`` limits which event classes are
    applied (None: every known one, the target's ``apply`` choosing); ``report`` collects
    what was applied and the seqs of what was not.
    """
    for record in records:
        if record.version <= target.version:
            continue
        applied = fold_step(target, record.version, record.event, accepts)
        if report is not None:
            if applied:
                report.applied += 1
            else:
                report.skipped.append(record.seq)
    return target
