"""``HOSTLER_*`` overrides of the daemon's settings, each validated where it is read.

Precedence for ``hostler serve`` and ``hostler daemon``: command-line flags, then these
variables, then the config file, then the defaults. A variable that is set but malformed is
refused in one line naming it (``usage.setting``, exit 2) before anything is created; an empty
one counts as unset. Every value is bounded: no allocation or loop is sized by what was given.

``HOSTLER_HOME`` (the default data directory) is read by :func:`hostler.paths.default_data_dir`;
the file's ``[daemon] data_dir`` names a specific place and wins over it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from hostler.bearer import valid_token
from hostler.capacity.origin import VARIABLE_SOURCE, floor_problem
from hostler.config import (
    MAX_BUDGET_BYTES,
    MIN_BUDGET_BYTES,
    ArbiterPolicy,
    Auth,
    BudgetSetting,
    DaemonConfig,
    SpilloverSetting,
)
from hostler.errors import SettingError
from hostler.fleet import host_name_problem
from hostler.paths import env_log, masked, user_path
from hostler.policies.eviction import valid_policy_name

__all__ = ["ENV_VARIABLES", "EnvOverrides", "apply_overrides", "read_overrides", "valid_token"]

#: Every variable read here, with what it sets (docs/serve.md has the same table).
ENV_VARIABLES = {
    "HOSTLER_CONFIG": "the config file when --config is not given",
    "HOSTLER_HOST": "[server] host",
    "HOSTLER_PORT": "[server] port",
    "HOSTLER_AUTH": "[server] auth",
    "HOSTLER_TOKEN": "the bearer token (else DATA_DIR/token)",
    "HOSTLER_IDLE_TIMEOUT": "[daemon] idle_timeout",
    "HOSTLER_BUDGET_BYTES": "[budget] bytes",
    "HOSTLER_SPILLOVER": "[budget] spillover",
    "HOSTLER_ARBITER": "[arbiter] policy",
    "HOSTLER_EVICTION": "[pool] eviction",
    "HOSTLER_MODELS_DIR": "where serve without a config looks for *.gguf",
    "HOSTLER_DB": "[daemon] log, and every command's --db",
    "HOSTLER_HOST_NAME": "[daemon] host_name (a fleet host's name)",
}
#: The longest value read from any of them (a path's limit); longer is refused, not scanned.
MAX_VALUE = 4096
MAX_SECONDS = 365 * 24 * 3600
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class EnvOverrides:
    """What the environment sets; None for each variable that is unset (or empty)."""

    config: Path | None = None
    host: str | None = None
    port: int | None = None
    auth: Auth | None = None
    token: str | None = field(default=None, repr=False)
    idle_timeout: float | None = None
    budget_bytes: BudgetSetting = None
    spillover: SpilloverSetting = None
    arbiter: ArbiterPolicy | None = None
    eviction: str | None = None
    models_dir: Path | None = None
    db: str | None = None
    host_name: str | None = None


def read_overrides(environ: Mapping[str, str]) -> EnvOverrides:
    """Read and validate every ``HOSTLER_*`` override in ``environ`` (``os.environ``).

    Raises:
        SettingError: One line naming the first malformed variable and what it takes.
    """
    raw = {name: environ.get(name, "").strip() for name in ENV_VARIABLES}
    for name, value in raw.items():
        if len(value) > MAX_VALUE:
            raise SettingError(f"{name}: over {MAX_VALUE} characters; fix it or unset it")
    return EnvOverrides(
        config=_path("HOSTLER_CONFIG", raw["HOSTLER_CONFIG"]),
        host=_host(raw["HOSTLER_HOST"]),
        port=_port(raw["HOSTLER_PORT"]),
        auth=_choice("HOSTLER_AUTH", raw["HOSTLER_AUTH"], ("token", "none")),  # type: ignore[arg-type]
        token=_token(raw["HOSTLER_TOKEN"]),
        idle_timeout=_seconds("HOSTLER_IDLE_TIMEOUT", raw["HOSTLER_IDLE_TIMEOUT"]),
        budget_bytes=_budget(raw["HOSTLER_BUDGET_BYTES"]),
        spillover=_spillover(raw["HOSTLER_SPILLOVER"]),
        arbiter=_choice("HOSTLER_ARBITER", raw["HOSTLER_ARBITER"], ("auto", "swap", "coexist")),  # type: ignore[arg-type]
        eviction=_eviction(raw["HOSTLER_EVICTION"]),
        models_dir=_path("HOSTLER_MODELS_DIR", raw["HOSTLER_MODELS_DIR"]),
        db=env_log(raw["HOSTLER_DB"]),
        host_name=_host_name(raw["HOSTLER_HOST_NAME"]),
    )


def apply_overrides(config: DaemonConfig, env: EnvOverrides) -> DaemonConfig:
    """``config`` with every variable that is set in its place (the file's value otherwise)."""
    return dataclasses.replace(
        config,
        host=config.host if env.host is None else env.host,
        port=config.port if env.port is None else env.port,
        auth=config.auth if env.auth is None else env.auth,
        token=config.token if env.token is None else env.token,
        idle_timeout=config.idle_timeout if env.idle_timeout is None else env.idle_timeout,
        budget_bytes=config.budget_bytes if env.budget_bytes is None else env.budget_bytes,
        budget_from=config.budget_from if env.budget_bytes is None else VARIABLE_SOURCE,
        spillover=config.spillover if env.spillover is None else env.spillover,
        arbiter=config.arbiter if env.arbiter is None else env.arbiter,
        eviction=config.eviction if env.eviction is None else env.eviction,
        log=config.log if env.db is None else env.db,
        host_name=config.host_name if env.host_name is None else env.host_name,
    )


def _refuse(name: str, value: str, wanted: str) -> SettingError:
    return SettingError(f"{name}={masked(value)[:60]!r}: {wanted}; fix it or unset the variable")


def _path(name: str, value: str) -> Path | None:
    if not value:
        return None
    try:
        return user_path(value, resolve=True)
    except ValueError as exc:
        raise _refuse(name, value, str(exc)) from None


def _host_name(value: str) -> str | None:
    if not value:
        return None
    problem = host_name_problem(value)
    if problem:
        raise _refuse("HOSTLER_HOST_NAME", value, problem)
    return value


def _host(value: str) -> str | None:
    if not value:
        return None
    if len(value) > 253 or not value.isascii() or not value.isprintable() or " " in value:
        raise _refuse("HOSTLER_HOST", value, "an address or host name to listen on")
    if "/" in value:
        raise _refuse("HOSTLER_HOST", value, "an address (no scheme, no path)")
    return value


def _port(value: str) -> int | None:
    if not value:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 5 or int(value) > 65535:
        raise _refuse("HOSTLER_PORT", value, "a port from 0 to 65535")
    return int(value)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str | None:
    if not value:
        return None
    if value.lower() not in allowed:
        raise _refuse(name, value, f"one of {', '.join(allowed)}")
    return value.lower()


def _eviction(value: str) -> str | None:
    """An eviction policy's name; whether one is called so is checked at start (PM17)."""
    if not value:
        return None
    if not valid_policy_name(value):
        raise _refuse(
            "HOSTLER_EVICTION",
            value,
            "an eviction policy's name (lower-case letters, digits, dashes: demand-lru, lru)",
        )
    return value


def _token(value: str) -> str | None:
    if not value:
        return None
    if not valid_token(value):
        # the value is a secret: never echoed
        raise SettingError(
            f"HOSTLER_TOKEN: not a usable token ({len(value)} characters): 32 to 256 printable "
            "ASCII characters without spaces; fix it or unset the variable"
        )
    return value


def _seconds(name: str, value: str) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value) if len(value) <= 32 else math.nan
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_SECONDS:  # NaN fails too
        raise _refuse(name, value, f"seconds from 0 to {MAX_SECONDS} (0: never)")
    return seconds


def _budget(value: str) -> int | Literal["auto"] | None:
    if not value:
        return None
    if value.lower() == "auto":
        return "auto"
    if value.isascii() and value.isdigit() and len(value) <= 19:
        number = int(value)
        if 0 < number <= MAX_BUDGET_BYTES:
            problem = floor_problem(number)
            if problem is None:
                return number
            raise _refuse("HOSTLER_BUDGET_BYTES", value, problem)
    raise _refuse(
        "HOSTLER_BUDGET_BYTES",
        value,
        f"a whole number of bytes from {MIN_BUDGET_BYTES} to 2^60, or auto",
    )


def _spillover(value: str) -> bool | Literal["auto"] | None:
    if not value:
        return None
    lowered = value.lower()
    if lowered == "auto":
        return "auto"
    if lowered in _TRUE | _FALSE:
        return lowered in _TRUE
    raise _refuse("HOSTLER_SPILLOVER", value, "true, false or auto")
