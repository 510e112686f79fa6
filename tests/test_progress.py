"""PG1: an adapter reads a long job's progress from the engine's output; hostler shows it.

The end-to-end proof (a render's steps seen rising in the pool's snapshot and ``hostler ps``
while the fake ``sd-server`` renders, gone once it is over) is in ``tests/test_sdcpp_lease.py``;
here: the :class:`Progress` value's edges, sd-server's bars, and a plugin whose hook answers
nonsense (the real ``llama-server``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hostler import EventStore
from hostler.cli.ps import ps_rows
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import PluginError
from hostler.plugin import EngineAdapter, LaunchSpec, Progress
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp import LlamaCppAdapter
from hostler_sdcpp import SdCppAdapter

KEY = "llamacpp:tiny:0"


@pytest.mark.parametrize(
    ("done", "total", "unit"),
    [(0, 1, "step"), (1, 1, "step"), (0, 2**31, "token"), (3, 20, "x" * 20)],
)
def test_progress_takes_its_edges(done: int, total: int, unit: str) -> None:
    assert Progress(done, total, unit) == Progress(done=done, total=total, unit=unit)


@pytest.mark.parametrize(
    ("done", "total", "unit", "field"),
    [
        (0, 0, "step", "total"),
        (0, -1, "step", "total"),
        (0, 2**31 + 1, "step", "total"),
        (0, 1.0, "step", "total"),
        (0, True, "step", "total"),
        (-1, 5, "step", "done"),
        (6, 5, "step", "done"),
        (1.0, 5, "step", "done"),
        (False, 5, "step", "done"),
        (1, 5, "", "unit"),
        (1, 5, "x" * 21, "unit"),
        (1, 5, 7, "unit"),
        (1, 5, "\x1b[2J", "unit"),  # an escape sequence for the operator's terminal
        (1, 5, "step\n", "unit"),
    ],
)
def test_progress_refuses_what_is_not_progress(
    done: Any, total: Any, unit: Any, field: str
) -> None:
    with pytest.raises(ValueError, match=f"Progress.{field}"):
        Progress(done, total, unit)


def test_the_default_adapter_reads_no_progress() -> None:
    assert EngineAdapter.progress(LlamaCppAdapter(), "  |=====>   | 3/20 - 1.52s/it") is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("  |=====>      | 3/20 - 1.52s/it", Progress(3, 20)),
        ("  |=>   | 1/4 - 0.75s/it\r  |===> | 2/4 - 0.75s/it", Progress(2, 4)),
        ("|==================================================| 20/20 - 2.10it/s", Progress(20, 20)),
        ("  |=====>      | 21/20 - 1.52s/it", None),  # past its total: not progress
        ("  |=====>      | 0/0 - 1.52s/it", None),
        ("  |=====>      | 3/20", None),  # no rate: not sd-server's bar
        (f"  |=>  | 1/{'9' * 5000} - 1.0s/it", None),  # digits past any count: no huge int
        ("loading model from 'sd.safetensors'", None),
    ],
)
def test_sd_server_bars_are_its_progress(line: str, expected: Progress | None) -> None:
    assert SdCppAdapter().progress(line) == expected


def test_ps_shows_the_progress_of_a_busy_engine() -> None:
    base = {"key": "sdcpp:sd:0", "state": "running", "busy": True}
    rows = ps_rows(
        {"engines": [{**base, "progress": {"done": 7, "total": 20, "unit": "step"}}]}, {}
    )
    assert rows[0][2] == "running 7/20 step"
    assert ps_rows({"engines": [{**base, "progress": None}]}, {})[0][2] == "running"


class Nonsense(LlamaCppAdapter):
    """A plugin whose progress hook answers a string once the engine prints."""

    def progress(self, line: str) -> Progress | None:
        return "halfway"  # type: ignore[return-value]


@pytest.mark.anyio
async def test_a_progress_hook_answering_nonsense_is_the_plugins_fault(tmp_path: Path) -> None:
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    with EventStore.open(tmp_path / "events.db") as store:
        sup = Supervisor(
            KEY,
            Nonsense(),
            lambda port: LaunchSpec(KEY, model, port, ctx_per_slot=512, work_dir=tmp_path),
            store,
            run_dir=tmp_path / "run",
            token_prefix="progress",
            policy=SupervisorPolicy(watch_interval=0.05),
        )
        # every hook's wrong answer reads the one way (Supervisor._ask): "returned X from HOOK"
        with pytest.raises(PluginError, match=r"Nonsense\) returned 'halfway' from progress$"):
            await sup.ensure_running()
        assert sup.pid is None
        assert [r.type for r in store.read_stream(f"engine/{KEY}")][-1] == "engine.failed"


def test_a_progress_unit_with_control_characters_is_refused() -> None:
    """Progress.unit is shown raw by `hostler ps`: one with control characters is refused.

    PG1: a bar that is out of range is no progress, and `hostler ps` prints
    ``state done/total unit``. Today Progress.__post_init__ checks only the unit's length,
    so a unit read from an engine's line (``"\\x1b[2J"``, ``"step\\n"``) reaches the
    operator's terminal through hostler.cli.ps._state, clearing the screen or breaking the
    table, where request_model, option names and the rest are held to isprintable().
    """
    for unit in ("\x1b[2J", "step\n", "\r\x07"):
        with pytest.raises(ValueError, match=r"(?i)unit"):
            Progress(1, 2, unit)
