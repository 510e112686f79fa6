"""Engine keys: ``engine:model:replica`` names exactly one supervised engine (rules K2–K3)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["EngineKey", "make_key", "parse_key"]

_ENGINE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True, slots=True)
class EngineKey:
    """A parsed engine key."""

    engine: str
    model: str
    replica: int

    def __str__(self) -> str:
        return f"{self.engine}:{self.model}:{self.replica}"


def make_key(engine: str, model: str, replica: int = 0) -> str:
    """K2: the key text; refuses an empty model, a model with ``:``, or a bad replica."""
    if not _ENGINE.match(engine):
        raise ValueError(f"engine name {engine!r} must be lower-case letters, digits, - or _")
    if not model or ":" in model:
        raise ValueError(f"model id {model!r} must be non-empty and contain no ':'")
    if type(replica) is not int or replica < 0:
        raise ValueError(f"replica {replica!r} must be a non-negative integer")
    return f"{engine}:{model}:{replica}"


def parse_key(text: str) -> EngineKey | None:
    """K3: split at the last ``:`` for the replica, the first for the engine; None if malformed."""
    head, sep, replica_text = text.rpartition(":")
    if not sep:
        return None
    engine, sep, model = head.partition(":")
    if not sep or not model or not _ENGINE.match(engine):
        return None
    try:  # isdigit() admits "²", which int() refuses; so does a number of 5000 digits
        replica = int(replica_text) if replica_text.isdigit() else -1
    except ValueError:
        return None
    if replica < 0 or str(replica) != replica_text:
        return None
    return EngineKey(engine, model, replica)
