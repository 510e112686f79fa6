"""Events of model discovery (stream ``models/host``): what ``hostler serve`` offers, and why.

Defined beside the event base so that ``import hostler`` registers them; the catalog
(:mod:`hostler.daemon_parts.catalog`) records them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hostler.events.base import Event, event_type

__all__ = ["MODELS_STREAM", "ModelsOffered"]

#: The stream of the discovered models' offer.
MODELS_STREAM = "models/host"


@event_type("models.offered")
@dataclass(frozen=True, slots=True)
class ModelsOffered(Event):
    """The discovered models offered changed (MD1–MD7): what came, what went, what is refused.

    Recorded when a walk's plan differs from the last recorded one (the first walk of a new
    log records every model); replaying the stream gives the offer a restart keeps ids from.

    Attributes:
        at: When the walk ran (epoch seconds).
        added: The models now offered: ``{"id", "path", "source", "size"}`` each.
        removed: The models no longer offered (their file is gone or changed), same shape.
        refused: What the walk found and does not offer: ``{"path", "reason"}`` each (the
            first 100).
        more_refused: How many more refusals there were.
    """

    at: float
    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    refused: list[dict[str, str]]
    more_refused: int = 0
