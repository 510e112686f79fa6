"""SG3 in pricing: a plugin's raise or wrong answer while ``hostler preview`` prices its model.

The daemon prices a launch inside the supervisor, which already blames the plugin; the CLI's
``hostler preview`` and any embedder call :func:`hostler.engines.price.price_engine` directly.
Each hook it asks (``validate_model``, ``read_geometry``, ``model_identity``,
``build_command``/``build_identity``, ``estimate_footprint``) is asked through
:func:`hostler.pluginhost.ask_adapter`: a raise that is not a ``HostlerError``, or an answer
of the wrong type, is one :class:`PluginError` naming the plugin and the hook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.learning import Calibration
from hostler.capacity.ledger import LedgerState
from hostler.capacity.units import GIB
from hostler.engines.price import LaunchRequest, price_engine
from hostler.errors import EngineBinaryError, PluginError
from hostler.plugin import LaunchCommand, LaunchSpec, ModelGeometry
from hostler.testing.fake_engine import FakeEngineAdapter


def price(adapter: FakeEngineAdapter, tmp_path: Path) -> int:
    model = tmp_path / "m.bin"
    model.write_bytes(b"\0" * 4096)
    priced = price_engine(
        adapter,
        LaunchRequest(key="fake:m:0", model=model, ctx=512, slots=1, kv_type=None),
        budget=compute_budget(HostMemory(system_ram=16 * GIB)),
        state=LedgerState(),
        calibration=Calibration(),
    ).price
    return int(priced.reserved_bytes)


def answering(hook: str, answer: Any) -> FakeEngineAdapter:
    """The fake engine's adapter, ``hook`` answering ``answer`` (raising it when an exception)."""

    def method(self: FakeEngineAdapter, *args: object) -> object:
        if isinstance(answer, BaseException):
            raise answer
        return answer

    made: type[FakeEngineAdapter] = type(f"Junk_{hook}", (FakeEngineAdapter,), {hook: method})
    return made()


@pytest.mark.parametrize(
    ("hook", "answer", "said"),
    [
        ("validate_model", "m.bin", "returned 'm.bin' from validate_model"),
        ("validate_model", KeyError("path"), "raised KeyError: 'path' in validate_model"),
        ("read_geometry", {"block_count": 2}, "returned {'block_count': 2} from read_geometry"),
        ("model_identity", 5, "returned 5 from model_identity"),
        ("build_command", ["fake-server"], "returned ['fake-server'] from build_command"),
        ("build_command", ZeroDivisionError("x"), "raised ZeroDivisionError: x in build_command"),
        ("build_identity", None, "returned None from build_identity"),
        ("estimate_footprint", "1 GiB", "returned '1 GiB' from estimate_footprint"),
        ("estimate_footprint", 1.5e9, "returned 1500000000.0 from estimate_footprint"),
        ("estimate_footprint", float("nan"), "returned nan from estimate_footprint"),
        ("estimate_footprint", True, "returned True from estimate_footprint, not a byte count"),
        ("estimate_footprint", -5, "returned -5 from estimate_footprint, not a byte count"),
        ("estimate_footprint", RuntimeError("no"), "raised RuntimeError: no in estimate_footprint"),
    ],
)
def test_a_plugins_junk_while_pricing_is_its_error_in_one_line(
    tmp_path: Path, hook: str, answer: Any, said: str
) -> None:
    with pytest.raises(PluginError) as caught:
        price(answering(hook, answer), tmp_path)
    message = caught.value.message
    assert message.startswith("the 'fake' engine plugin (")
    assert message.endswith(said)
    assert "\n" not in message


def test_a_byte_count_may_be_any_whole_number_type(tmp_path: Path) -> None:
    assert price(answering("estimate_footprint", np.int64(123 * 2**20)), tmp_path) >= 123 * 2**20
    assert price(answering("estimate_footprint", 0), tmp_path) >= 0  # zero bytes is a count


def test_a_missing_binary_while_pricing_is_no_fault_it_prices_an_unknown_build(
    tmp_path: Path,
) -> None:
    """A ``HostlerError`` from ``build_command`` (no binary on this host) is not a bug."""
    missing = answering("build_command", EngineBinaryError("fake-server not found"))
    assert price(missing, tmp_path) > 0


def test_the_types_the_hooks_are_held_to_are_what_the_contract_says() -> None:
    spec = LaunchSpec("fake:m:0", Path("/m"), 0, ctx_per_slot=1)
    adapter = FakeEngineAdapter()
    assert isinstance(adapter.build_command(spec), LaunchCommand)
    assert isinstance(adapter.read_geometry(Path(__file__)), ModelGeometry)
