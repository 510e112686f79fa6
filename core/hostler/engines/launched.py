"""A launch's spec in the log (``engine.spawned`` v3), so that an adopted engine has it again.

A daemon that adopts an engine an earlier one started (restart = replay + reconcile) knows
its process but not what it was launched with: the window, the slots, the KV type, where it
saves. The starter records those facts with the spawn; :func:`spec_from_record` rebuilds the
:class:`~hostler.plugin.LaunchSpec` from them, so the adopted run gets its prompt-cache adapter
(CC13: its sessions are saved before its stop, and keep their slots) and its lanes their real
width. A record that is missing or does not fit is None: the engine is adopted as before,
without a spec.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec

from hostler.plugin import LaunchSpec

__all__ = ["spec_from_record", "spec_record"]

_SCALARS = (str, int, float, bool)
_MOST = 10_000_000  # a window or slot count past this is no record of ours


def spec_record(spec: LaunchSpec) -> dict[str, Any]:
    """The facts of ``spec`` a later daemon needs, as plain JSON data (its offload plan aside).

    Options that are not plain scalars are left out.
    """
    return {
        "model": str(spec.model),
        "ctx_per_slot": spec.ctx_per_slot,
        "slots": spec.slots,
        "kv_type": spec.kv_type,
        "work_dir": None if spec.work_dir is None else str(spec.work_dir),
        "extra_args": dict(spec.extra_args),
        "options": {k: v for k, v in spec.options.items() if isinstance(v, _SCALARS)},
        "binary": None if spec.binary is None else str(spec.binary),
        "reserved_bytes": spec.reserved_bytes,
    }


class _Record(msgspec.Struct):
    model: str
    ctx_per_slot: Annotated[int, msgspec.Meta(ge=1, le=_MOST)]
    slots: Annotated[int, msgspec.Meta(ge=1, le=_MOST)]
    kv_type: str | None = None
    work_dir: str | None = None
    extra_args: dict[str, str | int | float | bool] = {}
    options: dict[str, str | int | float | bool] = {}
    binary: str | None = None
    reserved_bytes: Annotated[int, msgspec.Meta(ge=0)] | None = None


def spec_from_record(key: str, port: int, record: object) -> LaunchSpec | None:
    """The spec an engine of ``key`` on ``port`` was launched with, from its record.

    None when there is none or it does not fit: a log is data from outside, checked and
    never trusted.
    """
    if not isinstance(record, dict):
        return None
    try:
        told = msgspec.convert(record, _Record)
    except msgspec.ValidationError:
        return None
    paths = [path for path in (told.model, told.work_dir, told.binary) if path is not None]
    if any(not path or "\0" in path for path in paths):
        return None
    return LaunchSpec(
        key,
        Path(told.model),
        port,
        ctx_per_slot=told.ctx_per_slot,
        slots=told.slots,
        kv_type=told.kv_type,
        work_dir=None if told.work_dir is None else Path(told.work_dir),
        extra_args=told.extra_args,
        options=told.options,
        binary=None if told.binary is None else Path(told.binary),
        reserved_bytes=told.reserved_bytes,
        adopted=True,
    )
