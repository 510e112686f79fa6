"""The operator's context settings from the environment: C1's floor and C3's growth ceiling.

Pure: the caller (the CLI, a driver) passes the environment in as a mapping; nothing here reads
``os.environ``. A setting that is present must be a whole number of tokens between 1 and
:data:`MAX_CONTEXT_TOKENS`; anything else is refused with one line naming the variable and its
value, never silently ignored (a typo in a floor would otherwise launch short windows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hostler.errors import SettingError
from hostler.untrusted import parse_whole

__all__ = [
    "GROWTH_CEILING_ENV",
    "MAX_CONTEXT_TOKENS",
    "MIN_CONTEXT_ENV",
    "ContextOverrides",
    "parse_tokens",
    "read_context_overrides",
]

#: C1: the host floor (the smallest window admitted), replacing the 64K / 32K default.
MIN_CONTEXT_ENV = "HOSTLER_MIN_CONTEXT_TOKENS"
#: C3: how far adaptive growth may go (default: up to the model's native window).
GROWTH_CEILING_ENV = "HOSTLER_LLAMA_GROWTH_CEILING_TOKENS"
#: Larger than any model's window (16 Mi tokens): a bigger setting is a typo.
MAX_CONTEXT_TOKENS = 16_777_216


def parse_tokens(name: str, text: str | None) -> int | None:
    """One setting as a token count; None when unset or empty.

    Raises:
        SettingError: Not a whole number, below 1, or above :data:`MAX_CONTEXT_TOKENS`.
    """
    if text is None or not text.strip():
        return None
    stripped = text.strip()
    hint = f"set a whole number of tokens from 1 to {MAX_CONTEXT_TOKENS}, or unset it"
    value = parse_whole(stripped)  # more than 30 digits: saturated, so "absurdly large"
    if value is None:
        raise SettingError(f"{name}={_shown(stripped)} is not a whole number of tokens; {hint}")
    if value < 1:
        raise SettingError(f"{name}={_shown(stripped)} must be at least 1 token; {hint}")
    if value > MAX_CONTEXT_TOKENS:
        raise SettingError(f"{name}={_shown(stripped)} is absurdly large; {hint}")
    return value


def _shown(text: str) -> str:
    """A setting's text as a message shows it: one longer than 40 characters is cut."""
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class ContextOverrides:
    """The context settings in force (None: the rule's default applies).

    Attributes:
        min_context: C1's host floor in tokens, replacing the 65,536 / 32,768 default.
        growth_ceiling: C3's ceiling for adaptive growth in tokens (default: unbounded, i.e.
            the model's native window).
    """

    min_context: int | None = None
    growth_ceiling: int | None = None

    def in_force(self) -> dict[str, int]:
        """The settings that are set, by environment variable name (empty when none)."""
        settings = {MIN_CONTEXT_ENV: self.min_context, GROWTH_CEILING_ENV: self.growth_ceiling}
        return {name: value for name, value in settings.items() if value is not None}


def read_context_overrides(environ: Mapping[str, str]) -> ContextOverrides:
    """Read and validate both settings from an environment mapping (``os.environ``)."""
    return ContextOverrides(
        min_context=parse_tokens(MIN_CONTEXT_ENV, environ.get(MIN_CONTEXT_ENV)),
        growth_ceiling=parse_tokens(GROWTH_CEILING_ENV, environ.get(GROWTH_CEILING_ENV)),
    )
