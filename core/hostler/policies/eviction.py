"""Eviction policies (pure): the order in which idle engines are given up to make room (PP4).

A policy ranks idle engines, the least wanted first; :func:`hostler.capacity.victims.choose_victims`
takes the shortest prefix of that order whose bytes cover the shortfall. Two ship:

- ``demand-lru`` (the seed's, the default): fewest requests in the last minute first, then the
  longest unused, then the key;
- ``lru``: the longest unused first, then the key (demand ignored).

A plugin may add its own through the ``register_eviction_policies`` hook. A policy is a name, a
version (bumped whenever its order changes, so a recorded decision says which code made it) and
a sort key; it never reads a clock or does I/O, so replay and what-if can run it on recorded
figures (rule EV1, docs/rules.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hostler.errors import UsageError

if TYPE_CHECKING:
    from hostler.capacity.victims import Resident

__all__ = [
    "BUILTIN_EVICTION_POLICIES",
    "DEFAULT_EVICTION_POLICY",
    "DEMAND_LRU",
    "LRU",
    "EvictionPolicy",
    "RankedPolicy",
    "eviction_policy",
    "valid_policy_name",
]

_NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")


@runtime_checkable
class EvictionPolicy(Protocol):
    """What an eviction policy is: a stable name, a version and an order of idle engines."""

    @property
    def name(self) -> str:
        """Stable name (lowercase letters, digits and dashes; recorded in every decision)."""
        ...

    @property
    def version(self) -> int:
        """Bumped whenever the order it gives changes."""
        ...

    def rank(self, resident: Resident) -> Any:
        """A sort key: idle engines sorted by it give the least wanted first (EV1)."""
        ...


@dataclass(frozen=True, slots=True)
class RankedPolicy:
    """An eviction policy made of a name, a version and a sort-key function."""

    name: str
    version: int
    key: Any  # Callable[[Resident], Any]; Any keeps the frozen dataclass hashable and simple
    summary: str = ""

    def rank(self, resident: Resident) -> Any:
        """The sort key of ``resident`` (least wanted first)."""
        return self.key(resident)


def _demand_then_age(r: Resident) -> tuple[int, float, str]:
    return (r.recent_hits, r.last_used_at, r.key)


def _age(r: Resident) -> tuple[float, str]:
    return (r.last_used_at, r.key)


#: PP3/PP4: the seed's demand-weighted LRU — fewest recent requests, then longest unused.
DEMAND_LRU = RankedPolicy(
    "demand-lru", 1, _demand_then_age, "fewest requests in the last minute, then longest unused"
)
#: Plain least-recently-used: the longest unused first.
LRU = RankedPolicy("lru", 1, _age, "longest unused first")

#: The policies every hostler has, by name.
BUILTIN_EVICTION_POLICIES: Mapping[str, EvictionPolicy] = {p.name: p for p in (DEMAND_LRU, LRU)}
#: The policy used when none is configured.
DEFAULT_EVICTION_POLICY = DEMAND_LRU


def valid_policy_name(name: object) -> bool:
    """Whether ``name`` may name an eviction policy (``^[a-z][a-z0-9-]{0,39}$``)."""
    return isinstance(name, str) and _NAME.match(name) is not None


def eviction_policy(
    name: str, extra: Mapping[str, EvictionPolicy] | Iterable[EvictionPolicy] = ()
) -> EvictionPolicy:
    """The policy called ``name`` among the built-ins and ``extra`` (plugins'); else UsageError."""
    known: dict[str, EvictionPolicy] = dict(BUILTIN_EVICTION_POLICIES)
    items = extra.values() if isinstance(extra, Mapping) else extra
    for policy in items:
        known.setdefault(policy.name, policy)
    found = known.get(name)
    if found is None:
        raise UsageError(f"no eviction policy is named {name!r}; known: {', '.join(sorted(known))}")
    return found
