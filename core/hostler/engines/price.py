"""Price a configured launch the one way (driver): what ``hostler preview`` and the daemon share.

Gathers the inputs of :func:`hostler.capacity.pricing.price_launch` — the model's geometry, the
adapter's footprint estimate, the engine build (for learning), what other engines hold in the
host ledger, the budget, and the calibration folded from measured launches — and calls it. The
daemon's ledger reserves ``reserved_bytes`` of the result and launches with its plan;
``hostler preview`` shows the same figure as *reserved*.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from pathlib import Path

from hostler.capacity.budget import CapacityBudget
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.keys import parse_key
from hostler.capacity.learning import Calibration
from hostler.capacity.ledger import LedgerState, committed_other_for, limits_of
from hostler.capacity.overrides import ContextOverrides, read_context_overrides
from hostler.capacity.plan import PlanRequest
from hostler.capacity.pricing import LaunchPrice, price_launch
from hostler.capacity.slots import MAX_SLOTS
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.measure import load_calibration
from hostler.errors import HostlerError, PluginError
from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec, launch_command
from hostler.pluginhost import ask_adapter, plugin_fault

__all__ = ["engine_build", "price_engine", "price_from_ledger", "slot_limit_of"]


def slot_limit_of(adapter: EngineAdapter, geometry: ModelGeometry) -> int | None:
    """S8: the adapter's slot limit for a model of ``geometry``, checked.

    Raises:
        PluginError: The adapter answered something other than None or an int from 1 to
            :data:`~hostler.capacity.slots.MAX_SLOTS` (SG3: the plugin is named).
    """
    limit: object = adapter.slot_limit(geometry)
    if limit is not None and (type(limit) is not int or not 1 <= limit <= MAX_SLOTS):
        what = f"returned {repr(limit)[:60]} from slot_limit (None or an int from 1 to {MAX_SLOTS})"
        raise plugin_fault(adapter.engine_type, type(adapter), what)
    return limit


def engine_build(adapter: EngineAdapter, spec: LaunchSpec) -> str:
    """The build a launch of ``spec`` would run (as the supervisor names it), or ``unknown``."""
    try:
        command = ask_adapter(
            adapter, "build_command", launch_command, adapter, spec, returns=LaunchCommand
        )
        return str(
            ask_adapter(adapter, "build_identity", adapter.build_identity, command, returns=str)
        )
    except PluginError:
        raise  # the plugin's bug: said, not taken for a missing binary
    except HostlerError:  # no binary here: nothing learned applies
        return "unknown"


def price_engine(
    adapter: EngineAdapter,
    *,
    key: str,
    model: Path,
    ctx: int | None,
    slots: int | None,
    kv_type: str | None,
    budget: CapacityBudget,
    state: LedgerState,
    calibration: Calibration,
    extra_args: Mapping[str, str | int | float | bool] | None = None,
    policy: str = "adaptive",
    overrides: ContextOverrides | None = None,
    free_ram: int | None = None,
    standalone: bool = False,
    geometry: ModelGeometry | None = None,
    options: Mapping[str, object] | None = None,
) -> LaunchPrice:
    """Plan and price a launch of ``model`` as ``key`` (see the module's docstring).

    ``ctx`` and ``slots`` are what the operator asked for (a per-model window, taken as a
    deliberate override, C4); ``standalone`` prices the model as the only resident;
    ``geometry`` is the model's, when the caller read it already (with a projector, say).

    The same for every engine (RD4): the model validated by its adapter, the adapter's
    geometry and raw estimate, the adapter's S5 headroom (``kv_headroom``) in slot sizing,
    and learning's correction keyed by the adapter's ``model_identity``.
    """
    parsed = parse_key(key)
    # a folder's name is the model's (``Qwen3-0.6B-4bit``); a file's without its extension
    fallback = model.name if model.is_dir() else model.stem
    engine, name = (parsed.engine, parsed.model) if parsed else (adapter.engine_type, fallback)
    model = ask_adapter(adapter, "validate_model", adapter.validate_model, model, returns=Path)
    geometry = geometry or ask_adapter(
        adapter, "read_geometry", adapter.read_geometry, model, returns=ModelGeometry
    )
    identity = ask_adapter(adapter, "model_identity", adapter.model_identity, model, returns=str)
    extras = dict(extra_args or {})
    settings = dict(options or {})

    def spec(ctx_total: int, count: int, cache_type: str) -> LaunchSpec:
        count = max(1, count)
        return LaunchSpec(
            key=key,
            model=model,
            port=0,
            ctx_per_slot=max(1, ctx_total // count),
            slots=count,
            kv_type=cache_type,
            extra_args=extras,
            options=settings,
        )

    build = engine_build(adapter, spec(256, 1, kv_type or "f16"))

    def estimate(ctx_total: int, count: int, cache_type: str) -> int:
        planned = spec(ctx_total, count, cache_type)
        raw = ask_adapter(
            adapter, "estimate_footprint", adapter.estimate_footprint, geometry, planned,
            returns=numbers.Integral,
        )  # fmt: skip
        if isinstance(raw, bool) or raw < 0:  # a bool is no count, nor is -5 bytes
            what = f"returned {raw!r} from estimate_footprint, not a byte count"
            raise plugin_fault(adapter.engine_type, type(adapter), what)
        return int(raw)

    def correct(value: int, ctx_total: int, count: int, cache_type: str) -> int:
        return calibration.correct(
            value,
            model=identity,
            build=build,
            kv_type=cache_type,
            ctx_total=ctx_total,
            slots=count,
        )

    return price_launch(
        PlanRequest(
            name,
            ctx=ctx,
            ctx_is_model_override=ctx is not None,
            slots=slots,
            kv_type=kv_type,
            policy=policy,
            min_context=overrides.min_context if overrides else None,
            growth_ceiling=overrides.growth_ceiling if overrides else None,
            engine=engine,
            kv_headroom=adapter.kv_headroom,
            max_slots=slot_limit_of(adapter, geometry),
            kv_types=adapter.kv_types,
        ),
        geometry,
        budget,
        limits_of(state, budget),
        committed_other=0 if standalone else committed_other_for(state, engine, name),
        estimate=estimate,
        correct=correct,
        free_ram=free_ram,
    )


def price_from_ledger(
    adapter: EngineAdapter,
    ledger: HostLedger,
    *,
    key: str,
    model: Path,
    ctx: int | None,
    slots: int | None,
    kv_type: str | None,
    extra_args: Mapping[str, str | int | float | bool] | None = None,
    options: Mapping[str, object] | None = None,
) -> LaunchPrice:
    """:func:`price_engine` against the host ledger as it stands now (the daemon's way)."""
    return price_engine(
        adapter,
        key=key,
        model=model,
        ctx=ctx,
        slots=slots,
        kv_type=kv_type,
        budget=ledger.budget(),
        state=ledger.refresh(),
        calibration=load_calibration(ledger.store),
        extra_args=extra_args,
        options=options,
        overrides=read_context_overrides(os.environ),  # C1, C3: as preview reads them
    )
