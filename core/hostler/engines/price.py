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
from dataclasses import dataclass, field
from pathlib import Path

from hostler.capacity.budget import CapacityBudget
from hostler.capacity.cpu_limits import CpuLimits, weights_unrunnable
from hostler.capacity.geometry import ModelGeometry
from hostler.capacity.keys import parse_key
from hostler.capacity.learning import Calibration
from hostler.capacity.ledger import LedgerState, committed_other_for, limits_of
from hostler.capacity.offload import OffloadPlan
from hostler.capacity.overrides import ContextOverrides, read_context_overrides
from hostler.capacity.plan import PlanRequest
from hostler.capacity.pricing import LaunchPrice, price_launch
from hostler.capacity.slots import MAX_SLOTS
from hostler.drivers.host_ledger import HostLedger
from hostler.drivers.measure import load_calibration
from hostler.errors import EngineStartError, HostlerError, PluginError
from hostler.plugin import EngineAdapter, LaunchCommand, LaunchSpec, launch_command
from hostler.pluginhost import ask_adapter, plugin_fault
from hostler.probes.cpu import cpu_identity

__all__ = [
    "LaunchRequest",
    "PricedLaunch",
    "engine_build",
    "price_engine",
    "price_from_ledger",
    "slot_limit_of",
]


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """What the operator asked of one engine's launches: the one input of its price and its spec.

    Both the price (the build that learning is keyed by, the adapter's estimates) and the
    launch itself are made from this one object, so a setting that changes the launch (its
    ``binary``, ``options``, ``extra_args``) can never be missing from the price.

    Attributes:
        key: The engine key (``engine:model:replica``).
        model: The model's path, as configured.
        ctx: The per-slot window asked for (None: the planner's).
        slots: The slots asked for (None: the planner's).
        kv_type: The KV cache type asked for (None: the planner's).
        extra_args: The operator's engine flags.
        options: The engine's checked ``options``.
        binary: The engine program configured (None: the adapter's own).
        work_dir: Where a launch may write (None for a preview).
    """

    key: str
    model: Path
    ctx: int | None = None
    slots: int | None = None
    kv_type: str | None = None
    extra_args: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    options: Mapping[str, object] = field(default_factory=dict)
    binary: Path | None = None
    work_dir: Path | None = None

    def spec(
        self,
        *,
        port: int,
        ctx_per_slot: int,
        slots: int,
        kv_type: str | None,
        model: Path | None = None,
        offload: OffloadPlan | None = None,
    ) -> LaunchSpec:
        """The launch spec of this request at a plan's window, slots, KV type and offload.

        ``model`` is the model as its adapter validated it, when the caller has it;
        ``offload`` the plan's L12 decision for a MoE model on a card.
        """
        return LaunchSpec(
            key=self.key,
            model=self.model if model is None else model,
            port=port,
            ctx_per_slot=ctx_per_slot,
            slots=slots,
            kv_type=kv_type,
            work_dir=self.work_dir,
            extra_args=dict(self.extra_args),
            options=dict(self.options),
            binary=self.binary,
            offload=offload,
        )


@dataclass(frozen=True, slots=True)
class PricedLaunch:
    """One start's price and the launch it pays for (made by :func:`price_engine`).

    Attributes:
        request: What the operator asked.
        price: The plan and the bytes the ledger is to hold.
    """

    request: LaunchRequest
    price: LaunchPrice

    @property
    def reserved_bytes(self) -> int:
        """What the ledger holds for this launch (the estimate corrected by learning)."""
        return int(self.price.reserved_bytes)

    def spec(self, port: int) -> LaunchSpec:
        """The launch spec on ``port``: the request at the price's plan (its L12 offload too)."""
        return self.request.spec(
            port=port,
            ctx_per_slot=self.price.ctx_per_slot,
            slots=self.price.slots,
            kv_type=self.price.kv_type,
            offload=self.price.plan.offload,
        )


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
    request: LaunchRequest,
    *,
    budget: CapacityBudget,
    state: LedgerState,
    calibration: Calibration,
    policy: str = "adaptive",
    overrides: ContextOverrides | None = None,
    free_ram: int | None = None,
    standalone: bool = False,
    geometry: ModelGeometry | None = None,
    cpu_limits: CpuLimits | None = None,
) -> PricedLaunch:
    """Plan and price a launch of ``request`` (see the module's docstring).

    The request's ``ctx`` and ``slots`` are what the operator asked for (a per-model window,
    taken as a deliberate override, C4); ``standalone`` prices the model as the only resident;
    ``geometry`` is the model's, when the caller read it already (with a projector, say);
    ``cpu_limits`` what builds were seen unable to run on this CPU (L22: a quantized KV cache,
    or the model's weights).

    The same for every engine (RD4): the model validated by its adapter, the adapter's
    geometry and raw estimate, the adapter's S5 headroom (``kv_headroom``) in slot sizing,
    and learning's correction keyed by the adapter's ``model_identity``.
    """
    key, ctx, slots, kv_type = request.key, request.ctx, request.slots, request.kv_type
    parsed = parse_key(key)
    model = request.model
    # a folder's name is the model's (``Qwen3-0.6B-4bit``); a file's without its extension
    fallback = model.name if model.is_dir() else model.stem
    engine, name = (parsed.engine, parsed.model) if parsed else (adapter.engine_type, fallback)
    model = ask_adapter(adapter, "validate_model", adapter.validate_model, model, returns=Path)
    geometry = geometry or ask_adapter(
        adapter, "read_geometry", adapter.read_geometry, model, returns=ModelGeometry
    )
    identity = ask_adapter(adapter, "model_identity", adapter.model_identity, model, returns=str)

    def spec(ctx_total: int, count: int, cache_type: str) -> LaunchSpec:
        # the launch's own spec (its binary, options and flags) at a trial plan: the build
        # learning is keyed by, and the estimates, are those of what would really run
        count = max(1, count)
        return request.spec(
            port=0,
            ctx_per_slot=max(1, ctx_total // count),
            slots=count,
            kv_type=cache_type,
            model=model,
        )

    build = engine_build(adapter, spec(256, 1, kv_type or "f16"))
    kv_types = adapter.kv_types
    if cpu_limits is not None:
        cpu = cpu_identity()
        failed = cpu_limits.unrunnable(build, cpu, identity)
        if failed is not None:  # L22: it died of SIGILL here at f16 KV: refused at once
            raise EngineStartError(weights_unrunnable(key, failed.message))
        kv_types = cpu_limits.kv_types(build, cpu, kv_types)
        if kv_type is not None and kv_types is not None and kv_type not in kv_types:
            kv_type = kv_types[0]  # the operator's quantized type died here: f16, as L22 retries

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

    price = price_launch(
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
            kv_types=kv_types,
        ),
        geometry,
        budget,
        limits_of(state, budget),
        committed_other=0 if standalone else committed_other_for(state, engine, name),
        estimate=estimate,
        correct=correct,
        free_ram=free_ram,
    )
    return PricedLaunch(request, price)


def price_from_ledger(
    adapter: EngineAdapter,
    ledger: HostLedger,
    request: LaunchRequest,
    *,
    cpu_limits: CpuLimits | None = None,
) -> PricedLaunch:
    """:func:`price_engine` against the host ledger as it stands now (the daemon's way)."""
    return price_engine(
        adapter,
        request,
        budget=ledger.budget(),
        state=ledger.refresh(),
        calibration=load_calibration(ledger.store),
        overrides=read_context_overrides(os.environ),  # C1, C3: as preview reads them
        cpu_limits=cpu_limits,
    )
