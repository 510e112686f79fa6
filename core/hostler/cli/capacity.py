"""``hostler budget`` and ``hostler preview``: the host's budget, and a model's plan and why.

Both read this host (its memory, the ledger, the model file) unless given ``--url`` (or
``$HOSTLER_URL``): then the running daemon answers (``cli/remote_capacity.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from hostler.capacity.budget import BudgetKind, CapacityBudget
from hostler.capacity.gguf_header import read_geometry
from hostler.capacity.learning import Calibration
from hostler.capacity.ledger import LedgerState, committed_snapshot, limits_of
from hostler.capacity.overrides import ContextOverrides, read_context_overrides
from hostler.capacity.pricing import LaunchPrice
from hostler.capacity.units import GIB, KIB, MIB, format_half_up, round_half_up
from hostler.cli import remote_capacity
from hostler.cli.client import DEFAULT_URL, daemon_url
from hostler.config import DaemonConfig, EngineConfig, load_config
from hostler.drivers.host_ledger import (
    catch_up,
    default_ledger_path,
    engine_alive,
    owner_alive,
)
from hostler.drivers.measure import load_calibration
from hostler.engines.factory import configured_request
from hostler.engines.price import LaunchRequest, price_engine
from hostler.errors import UsageError
from hostler.events.base import encode
from hostler.pluginhost import PluginHost
from hostler.probes.device import DeviceSampled, budget_from, sample_device
from hostler.probes.host import boot_id
from hostler.probes.nvml import open_nvml
from hostler.settings_env import read_overrides
from hostler.store.log import EventStore

__all__ = ["run_budget", "run_preview"]


def _sample() -> DeviceSampled:
    probe = open_nvml()
    try:
        return sample_device(probe, at=time.time())
    finally:
        probe.close()


def _read_ledger(path: Path) -> tuple[LedgerState, Calibration]:
    """The ledger's reservations and what its measurements taught, in one open."""
    if not path.exists():
        return LedgerState(), Calibration()  # a reader never creates the host's ledger
    with EventStore.open(path) as store:
        return catch_up(store), load_calibration(store)


def _gib(value: float) -> str:
    if abs(value) < GIB:
        return f"{format_half_up(value, 1, per=MIB)} MiB"
    return f"{format_half_up(value, 1, per=GIB)} GiB"


def _describe_host(sample: DeviceSampled, budget: CapacityBudget) -> list[str]:
    if sample.gpus:
        cards = ", ".join(f"{g['name']} {_gib(g['total'])}" for g in sample.gpus)
    else:
        cards = f"no GPU ({sample.gpu_note})" if sample.gpu_note else "no GPU"
    lines = [
        f"host     {budget.kind}: RAM {_gib(sample.system_ram)} "
        f"({_gib(sample.free_ram)} reclaimable now); {cards}"
    ]
    how = "set by HOSTLER_CAPACITY_BUDGET_GB" if budget.overridden else "automatic"
    if budget.kind is BudgetKind.DISCRETE:
        split = f"{_gib(budget.vram)} usable VRAM + {_gib(budget.ram_share)} RAM share"
    elif budget.system_ram:
        split = f"{round_half_up(100 * budget.budget, budget.system_ram)}% of RAM"
    else:
        split = ""
    lines.append(f"budget   {_gib(budget.budget)} ({split}; {how})")
    lines.append(
        f"         fast {_gib(budget.fast)}; slots sized on {_gib(budget.concurrency_sizing)}; "
        f"RAM spillover {'on' if budget.ram_spillover_auto else 'off'} by default"
    )
    return lines


def run_budget(args: argparse.Namespace) -> int:
    """Print the budget and the ledger (the running daemon's with ``--url``)."""
    changing = args.set is not None or args.spillover is not None
    url = None if args.ledger and not args.url else daemon_url(args, default=None)
    if url is None and changing:
        if args.ledger:
            raise UsageError("--set and --spillover change a running daemon's budget: no --ledger")
        url = DEFAULT_URL
    if url is not None:
        if args.ledger:
            raise UsageError("--ledger reads this host's ledger: not with --url")
        return remote_capacity.run_budget(args, url)
    sample = _sample()
    budget = budget_from(sample)
    path: Path = args.ledger or default_ledger_path()
    state, _ = _read_ledger(path)
    this_boot = boot_id()
    owners = {h.owner for h in state.reservations.values()}
    alive = [o for o in owners if owner_alive(o, this_boot=this_boot)]
    snapshot = committed_snapshot(state, budget, alive)
    if args.json:
        print(json.dumps({"device": encode(sample)[2], "ledger": str(path), **snapshot}, indent=2))
        return 0
    limits = limits_of(state, budget)
    print("\n".join(_describe_host(sample, budget)))
    enforced = "" if limits.enforced else " (NOT enforced: explicit budget under 1 GiB)"
    print(
        f"ledger   {path}{'' if path.exists() else ' (not created yet)'}: "
        f"{len(state.reservations)} reservation(s), {_gib(state.committed)} committed of "
        f"{_gib(limits.budget)}{enforced}, co-residency ceiling {_gib(limits.ceiling)}"
    )
    for row in snapshot["by_key"]:
        flag = ""
        if not row.get("owner_alive", True):
            held = state.held(row["owner"], row["key"])
            running = held is not None and engine_alive(held)
            flag = (
                f"  (owner gone; held while its engine pid {row['pid']} runs)"
                if running
                else "  (owner and engine gone: released on the next decision)"
            )
        print(f"  {row['key']:<40} {_gib(row['bytes']):>10}  {row['owner']}{flag}")
    return 0


def run_preview(args: argparse.Namespace) -> int:
    """Plan, price (the way the daemon does) and print (the daemon's own plan with ``--url``)."""
    config = _preview_config(args)
    configured = None if config is None else config.engine_named(str(args.model))
    local = configured is not None or args.model.exists()
    url = args.url or (None if local else daemon_url(args, default=None))
    if url is not None:
        return remote_capacity.run_preview(args, url)
    for option in ("ctx", "slots"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise UsageError(f"--{option} must be at least 1")
    settings = read_context_overrides(os.environ)  # C1, C3: refused before any work if bad
    if config is not None and configured is None and not args.model.exists():
        names = ", ".join(e.key for e in config.engines[:8]) or "none"
        raise UsageError(
            f"{str(args.model)[:200]}: no such model file, and no engine of the config is "
            f"called that (its engines: {names}); give a path, an engine key or a model id"
        )
    plugins = PluginHost().load()
    if config is not None and configured is not None:
        request = _configured_request(config, configured, args)
        engine = request.key.split(":", 1)[0]
        if args.engine is not None and args.engine != engine:
            raise UsageError(f"--engine {args.engine}: {request.key} is a {engine} engine")
    else:
        engine = args.engine or "llamacpp"
        request = LaunchRequest(
            key="", model=args.model, ctx=args.ctx, slots=args.slots, kv_type=args.kv
        )
    adapter = plugins.adapter(engine)
    model_path: Path = adapter.validate_model(request.model)
    if args.mmproj is not None:  # a projector is llama.cpp's: both read as GGUF
        geometry = read_geometry(model_path, mmproj=args.mmproj)
    else:  # RD4: the engine's own reader (a GGUF header by default)
        geometry = adapter.read_geometry(model_path)
    sample = _sample()
    budget = budget_from(sample)
    path = _preview_ledger(args, config)
    state, calibration = _read_ledger(path)
    name = model_path.name if model_path.is_dir() else model_path.stem  # a folder: all of it
    if configured is None:
        request = dataclasses.replace(request, key=f"{engine}:{name}:0", model=model_path)
    price = price_engine(
        adapter,
        request,
        budget=budget,
        state=state,
        calibration=calibration,
        policy=args.policy,
        overrides=settings,
        free_ram=sample.free_ram if args.live else None,
        standalone=args.standalone,
        geometry=geometry,
    ).price
    if args.json:
        print(json.dumps(_plan_dict(price, geometry.architecture, settings), indent=2))
    else:
        lines = _describe_plan(name, geometry.architecture, geometry.block_count, price)
        print("\n".join(lines[:2] + _describe_settings(settings) + lines[2:]))
    return 0 if price.admitted else 3


def _preview_config(args: argparse.Namespace) -> DaemonConfig | None:
    """The daemon config a preview prices with: ``--config``, else ``$HOSTLER_CONFIG``.

    A preview asked of a running daemon (``--url``) takes no config from the environment.
    """
    path: Path | None = args.config
    if path is not None and args.url:
        raise UsageError("--config prices as this host's daemon would: not with --url")
    if path is None and not args.url:  # the environment's config is this host's, as --config
        path = read_overrides(os.environ).config
    return None if path is None else load_config(path, data_dir=None)


def _configured_request(
    config: DaemonConfig, engine: EngineConfig, args: argparse.Namespace
) -> LaunchRequest:
    """The configured engine's own launch request, with the window, slots and KV asked here."""
    request = configured_request(config, engine)
    return dataclasses.replace(
        request,
        ctx=request.ctx if args.ctx is None else args.ctx,
        slots=request.slots if args.slots is None else args.slots,
        kv_type=request.kv_type if args.kv is None else args.kv,
    )


def _preview_ledger(args: argparse.Namespace, config: DaemonConfig | None) -> Path:
    """``--ledger``, else the config's ledger, else the default one (as ``hostler budget``)."""
    if args.ledger is not None:
        return Path(args.ledger)
    if config is not None:
        return config.ledger_location().path
    return default_ledger_path()


def _describe_settings(settings: ContextOverrides) -> list[str]:
    meaning = {
        "HOSTLER_MIN_CONTEXT_TOKENS": "host floor: the smallest window admitted",
        "HOSTLER_LLAMA_GROWTH_CEILING_TOKENS": "ceiling of adaptive growth",
    }
    return [
        f"setting  {name}={value} ({meaning[name]})" for name, value in settings.in_force().items()
    ]


def _plan_dict(price: LaunchPrice, architecture: str, settings: ContextOverrides) -> dict[str, Any]:
    plan = price.plan
    return {
        "admitted": price.admitted,
        "architecture": architecture,
        "context_window": plan.context_window,
        "slots": plan.slots,
        "total_ctx": plan.total_ctx,
        "kv_type": plan.kv_type,
        "native_window": plan.native_window,
        "applied_override": plan.applied_override,
        "auto_window": plan.auto_window,
        "weights_bytes": plan.weights_bytes,
        "kv_fixed_per_slot": plan.kv.fixed,
        "kv_per_token_per_slot": plan.kv.per_token,
        "planned_bytes": plan.planned_bytes,
        "estimated_bytes": price.estimated,
        "reserved_bytes": price.reserved_bytes,
        "learned": price.learned,
        "settings": settings.in_force(),
        "committed_other_bytes": plan.committed_other,
        "exact_geometry": plan.exact_geometry,
        "denial": price.denial,
        "reasons": plan.reasons,
    }


def _describe_plan(name: str, arch: str, layers: int | None, price: LaunchPrice) -> list[str]:
    plan = price.plan
    verdict = "fits" if price.admitted else "DOES NOT FIT"
    source = "header geometry" if plan.exact_geometry else "heuristic (header incomplete)"
    lines = [
        f"model    {name} ({arch}, {layers or '?'} layers, native window {plan.native_window})",
        # in no engine's flags: each spells the window, slots and KV type its own way
        f"plan     {verdict}: {plan.context_window} tokens per slot × {plan.slots} slot(s) "
        f"({plan.total_ctx} tokens in all), KV {plan.kv_type}",
    ]
    if plan.applied_override is not None:
        lines.append(
            f"override {plan.applied_override} tokens asked; automatic would be {plan.auto_window}"
        )
    learned = (
        f"; {_gib(price.estimated)} estimated, corrected by measured launches"
        if price.learned
        else " (footprint estimate at peak: tensor data, repacked weights, KV cells, runtime)"
    )
    lines += [
        f"reserved {_gib(price.reserved_bytes)}: what the ledger holds for this launch{learned}",
        f"planned  {_gib(plan.planned_bytes)} (resident + one slot of KV: what one chat costs)",
        f"priced   resident {_gib(plan.weights_bytes)} + KV "
        f"{format_half_up(plan.kv.fixed, 0, per=KIB)} KiB fixed/slot + "
        f"{format_half_up(plan.kv.per_token, 2, per=KIB)} KiB/token/slot × window ({source})",
        f"others   {_gib(plan.committed_other)} held by other models "
        "(this model's replicas excluded)",
        "why",
        *(f"  - {reason}" for reason in plan.reasons),
    ]
    if price.denial:
        lines.append(f"denied   {price.denial}")
    return lines
