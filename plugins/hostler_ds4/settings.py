"""The operator's ds4 settings, validated at the edge: ``LaunchSpec.options``, flags, environment.

Three places can say something, later ones winning: the engine's ``options`` (a config table),
the environment (``HOSTLER_DS4_KV_DISK_MB``, ``HOSTLER_DS4_CWD``, D2) and the operator's
``extra_args`` for the flags the pricing must know (``--ctx``, ``--ssd-streaming``,
``--ssd-streaming-cache-experts``, ``--kv-disk-space-mb``, ``--kv-disk-dir``, ``--chdir``): an
operator's flag still wins, and the reservation follows it. Every other extra flag is passed
through, appended last. A bad value is one :class:`~hostler.errors.SettingError` line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hostler.plugin import SettingError, parse_whole

__all__ = ["OPTIONS", "OPTION_TYPES", "Ds4Settings", "passthrough", "read_settings"]

#: Every option a ds4 engine takes, and what it means.
OPTIONS: Mapping[str, str] = {
    "ctx": "engine-wide launch context in tokens (the host floor still holds, D5)",
    "model_ctx": "this model's launch context in tokens (below the floor it lowers it, C4)",
    "streaming": "false asks for full residency; honoured only when safe (D7)",
    "expert_cache_gib": "SSD-streaming expert cache in GiB (clamped to what is safe, D8)",
    "kv_disk_mb": "disk KV cache budget in MiB (default 16384, IN37)",
    "kv_dir": "where the disk KV cache lives (default: the engine's work directory's kv/)",
    "cwd": "the directory ds4-server loads its shaders from (default: the binary's)",
    "resident_bytes": "catalog: resident bytes measured at resident_ctx (D6)",
    "resident_ctx": "catalog: the context resident_bytes was measured at (D6)",
    "kv_bytes_per_token": "catalog: KV bytes per context token (D6)",
    "max_launch_ctx": "catalog: the largest context this model can be launched with (D5)",
    "cache_bytes": "catalog: the expert cache included in resident_bytes (D8)",
}
_INTS = {
    "ctx",
    "model_ctx",
    "expert_cache_gib",
    "kv_disk_mb",
    "resident_bytes",
    "resident_ctx",
    "kv_bytes_per_token",
    "max_launch_ctx",
    "cache_bytes",
}
#: Each option's type, as the config's ``options`` tables are checked against it at start
#: (``EngineAdapter.options_schema``); the values are checked again, with their bounds, here.
OPTION_TYPES: Mapping[str, type | tuple[type, ...]] = {
    name: int if name in _INTS else bool if name == "streaming" else str for name in OPTIONS
}
#: Flags read as settings (their value decides the price), by their option name.
_FLAGS = {
    "--ctx": "model_ctx",
    "--ssd-streaming": "streaming",
    "--ssd-streaming-cache-experts": "expert_cache_gib",
    "--kv-disk-space-mb": "kv_disk_mb",
    "--kv-disk-dir": "kv_dir",
    "--chdir": "cwd",
}
_GB = re.compile(r"^\s*([0-9]+)\s*(GB|G)?\s*$", re.IGNORECASE)
_WHOLE = re.compile(r"^\s*[+-]?[0-9]+\s*$")
_TRUE = {"true", "1", "yes", "on"}
#: The largest whole-number setting (2^60: bytes, tokens, MiB all fit below it).
MAX_WHOLE = 2**60
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True, slots=True)
class Ds4Settings:
    """What the operator set (None: not set)."""

    ctx: int | None = None
    model_ctx: int | None = None
    streaming: bool = True
    expert_cache_gib: int | None = None
    kv_disk_mb: int | None = None
    kv_dir: Path | None = None
    cwd: Path | None = None
    resident_bytes: int | None = None
    resident_ctx: int | None = None
    kv_bytes_per_token: int | None = None
    max_launch_ctx: int | None = None
    cache_bytes: int | None = None


def _flag(raw: str) -> str:
    return raw if raw.startswith("-") else f"--{raw}"


def _int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise SettingError(f"ds4 option {name}: a whole number, not {value}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and (
        _WHOLE.match(value) or (name == "expert_cache_gib" and _GB.match(value))
    ):
        match = _GB.match(value)
        # parse_whole: more than 30 digits saturate (never int()'s 4300-digit ValueError)
        number = parse_whole(match.group(1) if match else value) or 0
    else:
        raise SettingError(f"ds4 option {name}: a whole number, not {str(value)[:40]!r}")
    if number <= 0:
        raise SettingError(f"ds4 option {name}: must be above 0, not {number}")
    if number > MAX_WHOLE:
        shown = (
            str(value)
            if len(str(value)) <= 40
            else f"{str(value)[:20]}... ({len(str(value))} characters)"
        )
        raise SettingError(f"ds4 option {name}: {shown} is absurdly large (at most 2^60)")
    return number


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise SettingError(f"ds4 option {name}: true or false, not {str(value)[:40]!r}")


def _path(name: str, value: object) -> Path:
    if isinstance(value, bool) or not isinstance(value, str | Path) or not str(value).strip():
        raise SettingError(f"ds4 option {name}: a directory path, not {str(value)[:40]!r}")
    return Path(value).expanduser()


def _value(name: str, value: object) -> object:
    if name in _INTS:
        return _int(name, value)
    if name == "streaming":
        return _bool(name, value)
    return _path(name, value)


def read_settings(
    options: Mapping[str, object],
    extra_args: Mapping[str, str | int | float | bool],
    environ: Mapping[str, str],
) -> Ds4Settings:
    """The operator's settings from the three places (see the module's docstring).

    Raises:
        SettingError: An unknown option, or a value of the wrong kind or below 1.
    """
    found: dict[str, object] = {}
    for name, value in options.items():
        if name not in OPTIONS:
            known = ", ".join(sorted(OPTIONS))
            raise SettingError(f"ds4 has no option {name[:40]!r} (known: {known})")
        found[name] = _value(name, value)
    if environ.get("HOSTLER_DS4_KV_DISK_MB"):
        found["kv_disk_mb"] = _int("HOSTLER_DS4_KV_DISK_MB", environ["HOSTLER_DS4_KV_DISK_MB"])
    if environ.get("HOSTLER_DS4_CWD"):
        found["cwd"] = _path("HOSTLER_DS4_CWD", environ["HOSTLER_DS4_CWD"])
    for raw, value in extra_args.items():
        setting = _FLAGS.get(_flag(raw))
        if setting == "streaming":
            found[setting] = _bool(_flag(raw), value)
        elif setting is not None and value is not False:
            found[setting] = _value(setting, value)
    return Ds4Settings(**found)  # type: ignore[arg-type]


def passthrough(
    extra_args: Mapping[str, str | int | float | bool],
) -> list[tuple[str, str | None]]:
    """The operator's other flags, in order: ``(flag, value)``, value None for a bare flag.

    A value of False omits the flag; the ones read as settings are left out (their setting
    already decides the launch).
    """
    flags: list[tuple[str, str | None]] = []
    for raw, value in extra_args.items():
        flag = _flag(raw)
        if flag in _FLAGS or value is False:
            continue
        flags.append((flag, None if value is True else str(value)))
    return flags
