"""The one fold: replay, load, the ledger's catch-up and the calibration reader agree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hostler import EventStore
from hostler.capacity.learning import CALIBRATION_STREAM, FootprintMeasured
from hostler.capacity.ledger import LedgerState
from hostler.drivers.measure import load_calibration
from hostler.events.base import Event, decode, event_type, typed_decoder
from hostler.events.fold import FoldReport, fold
from hostler.events.ledger import LEDGER_STREAM, LedgerReleased, LedgerReserved

from _support import Note, insert_raw

if TYPE_CHECKING:
    from decimal import Context


def _measured(estimated: int, measured: int) -> FootprintMeasured:
    return FootprintMeasured(
        engine_key="llamacpp:m:0",
        model="m.gguf:100",
        build="b1",
        kv_type="f16",
        ctx_total=2048,
        slots=2,
        estimated=estimated,
        measured=measured,
        rss=measured,
        gpu=0,
        buffers=0,
    )


def _unknown(log_target: str, stream: str, version: int) -> None:
    insert_raw(log_target, stream, version, "gone_plugin.thing", "{}")


def test_fold_advances_the_version_past_what_it_does_not_apply(
    store: EventStore, log_target: str
) -> None:
    store.append(
        LEDGER_STREAM,
        [LedgerReserved("k", 100, "o", 0, 0, 1000, 1000, True)],
        expected_version=0,
    )
    _unknown(log_target, LEDGER_STREAM, 2)
    store.append(LEDGER_STREAM, [Note("foreign")], expected_version=2)
    report = FoldReport()
    state = fold(
        LedgerState(),
        store.read_stream(LEDGER_STREAM),
        accepts={LedgerReserved, LedgerReleased},
        report=report,
    )
    assert state.version == 3
    assert state.committed == 100
    assert report.applied == 1
    assert report.skipped == [2, 3]


def test_fold_catches_up_from_an_overlapping_read(store: EventStore) -> None:
    store.append(
        LEDGER_STREAM,
        [
            LedgerReserved("a", 100, "o", 0, 0, 1000, 1000, True),
            LedgerReserved("b", 200, "o", 0, 100, 1000, 1000, True),
        ],
        expected_version=0,
    )
    state = fold(LedgerState(), store.read_stream(LEDGER_STREAM))
    store.append(LEDGER_STREAM, [LedgerReleased("a", 100, "o", "released")], expected_version=2)
    report = FoldReport()
    fold(state, store.read_stream(LEDGER_STREAM), report=report)  # re-reads v1 and v2
    assert state.version == 3
    assert state.committed == 200
    assert report.applied == 1 and report.skipped == []


def test_calibration_folds_with_the_one_fold(store: EventStore, log_target: str) -> None:
    store.append(CALIBRATION_STREAM, [_measured(1000, 1100)], expected_version=0)
    _unknown(log_target, CALIBRATION_STREAM, 2)
    store.append(CALIBRATION_STREAM, [Note("foreign")], expected_version=2)
    calibration = load_calibration(store)
    assert calibration.version == 3
    assert calibration.offsets == {("m.gguf:100", "b1", "f16"): [100]}


@event_type("test.untypable")
@dataclass(frozen=True, slots=True)
class Untypable(Event):
    """An event whose annotation only a type checker can resolve: msgspec cannot type it."""

    thing: Context | None


def test_an_event_msgspec_cannot_type_still_decodes(log_path: Path) -> None:
    assert typed_decoder(Untypable) is None
    assert decode("test.untypable", 1, {"thing": None}) == Untypable(None)
    with EventStore.open(log_path) as store:
        store.append("s/u", [Untypable(None)], expected_version=0)
        (record,) = store.read_stream("s/u")
    assert record.event == Untypable(None)
