"""Tables fit a width: the least useful columns go first, then long values are cut with ``…``."""

from __future__ import annotations

import io

import pytest

from hostler.cli.tables import Table, fit_widths, print_table, table


def _grid() -> Table:
    grid = table(
        ("KEY", "PID", "STATE", "REASON"),
        ("PID",),
        drop=("PID",),
        cut={"REASON": 8, "KEY": 6},
    )
    grid.add_row("llamacpp:alpha:0", "12345", "running", "evicted for llamacpp:gamma:0")
    return grid


def _print(grid: Table, monkeypatch: pytest.MonkeyPatch, columns: str | None) -> list[str]:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    out = io.StringIO()
    print_table(grid, out)
    return out.getvalue().splitlines()


def test_without_a_width_every_column_is_whole() -> None:
    grid = _grid()
    assert fit_widths(grid, None) == [(0, 16), (1, 5), (2, 7), (3, 28)]
    # 16 + 5 + 7 + 28 + 3 gaps of 2 = 62: fits 62 as it is
    assert fit_widths(grid, 62) == [(0, 16), (1, 5), (2, 7), (3, 28)]


def test_values_are_cut_before_a_column_goes_when_that_is_enough() -> None:
    grid = _grid()
    # 61: one character short; the widest cuttable column (REASON) gives it
    assert fit_widths(grid, 61) == [(0, 16), (1, 5), (2, 7), (3, 27)]
    # 40: 22 short, and REASON (28 → 8) and KEY (16 → 6) can give 30: cut, the widest first,
    # until both are 11 wide; PID stays
    assert fit_widths(grid, 40) == [(0, 11), (1, 5), (2, 7), (3, 11)]


def test_the_least_useful_column_goes_when_cutting_is_not_enough() -> None:
    grid = _grid()
    # 30: even at their narrowest (6 + 5 + 7 + 8 and 3 gaps: 32) the four columns are too
    # wide: PID goes, then KEY and REASON are cut to fit
    assert fit_widths(grid, 30) == [(0, 9), (2, 7), (3, 10)]


def test_printed_lines_fit_and_a_pipe_without_columns_gets_whole_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _print(_grid(), monkeypatch, None) == [
        "KEY                 PID  STATE    REASON",
        "llamacpp:alpha:0  12345  running  evicted for llamacpp:gamma:0",
    ]
    assert _print(_grid(), monkeypatch, "30") == [
        "KEY        STATE    REASON",
        "llamacpp…  running  evicted f…",
    ]
    # narrower than any fit: each line is cut at the edge
    assert _print(_grid(), monkeypatch, "12") == ["KEY     STA…", "llama…  run…"]


def test_a_row_must_match_the_headers_and_options_name_columns() -> None:
    grid = table(("A", "B"))
    with pytest.raises(ValueError, match="a row of 1 cells for 2 columns"):
        grid.add_row("x")
    with pytest.raises(ValueError, match=r"not columns of this table: \['C'\]"):
        table(("A", "B"), drop=("C",))


def test_events_wide_shows_a_long_stream_whole() -> None:
    """``hostler events --wide``: every column whole (a breaking helper saw the stream cut)."""
    from hostler.cli.render import EventRow, TableWriter

    stream = "engine/llamacpp:lms-publisher-some-long-model-name-q8_0:0"
    row = EventRow(
        seq=7,
        recorded_at="2026-12-05T17:00:00.000",
        stream=stream,
        version=1,
        type="engine.start_requested",
        details="cause=request",
    )
    _, line = TableWriter(wide=True).lines([row])
    assert line.split() == ["7", "2026-12-05", "17:00:00.000", stream, "1",
                            "engine.start_requested", "cause=request"]  # fmt: skip
    assert "…" not in line
    cut = list(TableWriter(width=80).lines([row]))[1]
    assert len(cut) <= 80 and "…" in cut  # a terminal's width still cuts it
