"""The capacity ledger's policy: reservations per engine key against the budget (pure).

Rules CB1–CB12 of the reference behaviour, and the ownership rules OW1–OW3 (docs/rules.md).
:class:`LedgerState` is folded from ledger events;
:func:`decide_reserve` turns a state, the host's automatic budget and a request into a
:class:`ReserveDecision` that carries every input it used, so the decision can be recorded,
replayed and explained. Nothing here reads a clock or the machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from hostler.capacity.budget import CapacityBudget
from hostler.capacity.keys import parse_key
from hostler.capacity.origin import (
    AUTOMATIC_ORIGIN,
    BUDGET_FLOOR,
    BudgetOrigin,
    origin_of,
    raise_hint,
)
from hostler.capacity.units import GIB, format_half_up, round_half_up
from hostler.events.base import Event
from hostler.events.ledger import (
    LedgerAdopted,
    LedgerBound,
    LedgerBudgetSet,
    LedgerCarried,
    LedgerDenied,
    LedgerMeasured,
    LedgerReleased,
    LedgerReserved,
    LedgerSpilloverSet,
)

__all__ = [
    "ENFORCE_MINIMUM",
    "Decided",
    "Held",
    "LedgerLimits",
    "LedgerState",
    "ReserveDecision",
    "committed_other_for",
    "decide_adopt",
    "decide_reserve",
    "denial_reason",
    "fallback_resident_bytes",
    "format_denial",
    "limits_of",
    "shortfall",
]

#: An explicit budget below this is recorded but not enforced (CB1): one in an old log (a
#: budget under it is refused where it is given now, :func:`hostler.capacity.origin.floor_problem`).
ENFORCE_MINIMUM = BUDGET_FLOOR
CO_RESIDENCY_SUFFIX = " (co-residency ceiling — RAM spillover off)"


@dataclass(frozen=True, slots=True)
class Held:
    """One reservation: ``bytes`` held for an engine key by an owner (a daemon's identity).

    ``token`` is the launch token of the engine process it pays for; ``pid`` and
    ``create_time`` that process once it exists (OW2: it outlives its owner while it runs).
    ``measured`` is the engine's measured footprint once ready (it then replaces ``bytes``);
    ``admitted`` the bytes it was admitted with, when they differ from ``bytes`` (None: the
    same).
    """

    key: str
    bytes: int
    owner: str
    token: str | None = None
    pid: int | None = None
    create_time: float | None = None
    measured: int | None = None
    admitted: int | None = None
    #: The bound process's start in ticks since boot (exact; None: compare ``create_time``).
    since_boot: float | None = None

    @property
    def slot(self) -> tuple[str, str]:
        """Where it is filed: (owner, key)."""
        return (self.owner, self.key)

    @property
    def reserved(self) -> int:
        """The bytes it was admitted with (before any measurement replaced them)."""
        return self.bytes if self.admitted is None else self.admitted


@dataclass(frozen=True, slots=True)
class Decided:
    """The limits the ledger's last decision recorded (a reserve, a denial, an adoption).

    ``ceiling`` and ``enforced`` are None until a decision that records them (an adoption
    records only the budget; a denial no ``enforced``).
    """

    budget: int
    ceiling: int | None = None
    enforced: bool | None = None


@dataclass
class LedgerState:
    """What the ledger holds, folded from its events.

    Attributes:
        reservations: Held bytes by (owner, engine key): two owners never share one (OW1).
        explicit_budget: An operator's budget in bytes, or None for the automatic one.
        budget_source: Where the explicit budget was set, as recorded (``ledger.budget_set``'s
            ``source``; "" when not said).
        spillover: An operator's RAM-spillover choice, or None for the automatic one.
        version: The ledger stream's version this state reflects.
        decided: The limits of the last decision recorded, or None before any.
    """

    reservations: dict[tuple[str, str], Held] = field(default_factory=dict)
    explicit_budget: int | None = None
    spillover: bool | None = None
    version: int = 0
    decided: Decided | None = None
    budget_source: str = ""

    @property
    def committed(self) -> int:
        """Bytes held by every reservation."""
        return sum(h.bytes for h in self.reservations.values())

    def held(self, owner: str, key: str) -> Held | None:
        """``owner``'s reservation for ``key``, if any."""
        return self.reservations.get((owner, key))

    def by_token(self, token: str) -> Held | None:
        """The reservation paying for the engine launched with ``token``, if any."""
        for held in self.reservations.values():
            if held.token == token:
                return held
        return None

    def apply(self, event: Event) -> None:
        """Fold one ledger event (others are ignored)."""
        if isinstance(event, LedgerReserved):
            prior = self.reservations.get((event.owner, event.key))
            keep = prior is not None and prior.token == event.token
            self.reservations[(event.owner, event.key)] = Held(
                event.key,
                event.bytes,
                event.owner,
                event.token,
                prior.pid if keep and prior else None,
                prior.create_time if keep and prior else None,
            )
            self.decided = Decided(event.budget, event.ceiling, event.enforced)
        elif isinstance(event, LedgerMeasured):
            prior = self.reservations.get((event.owner, event.key))
            if prior is not None:
                self.reservations[prior.slot] = replace(
                    prior, bytes=event.bytes, measured=event.bytes, admitted=prior.reserved
                )
            else:
                self.reservations[(event.owner, event.key)] = Held(
                    event.key,
                    event.bytes,
                    event.owner,
                    measured=event.bytes,
                    admitted=event.estimated,
                )
        elif isinstance(event, LedgerBound):
            prior = self.reservations.get((event.owner, event.key))
            if prior is not None:
                self.reservations[prior.slot] = replace(
                    prior,
                    pid=event.pid,
                    create_time=event.create_time,
                    since_boot=event.since_boot,
                )
        elif isinstance(event, LedgerAdopted | LedgerCarried):
            self._hold(event)
        elif isinstance(event, LedgerReleased):
            self.reservations.pop((event.owner, event.key), None)
        elif isinstance(event, LedgerDenied):
            held = self.decided
            self.decided = Decided(event.budget, event.ceiling, held.enforced if held else None)
        elif isinstance(event, LedgerBudgetSet):
            self.explicit_budget = event.budget
            self.budget_source = event.source if event.budget is not None else ""
        elif isinstance(event, LedgerSpilloverSet):
            self.spillover = event.allowed

    def _hold(self, event: LedgerAdopted | LedgerCarried) -> None:
        """OW3/OW6: the bytes of a running engine held for their (new) owner, unmeasured."""
        if isinstance(event, LedgerAdopted):
            if event.from_owner is not None:
                self.reservations.pop((event.from_owner, event.key), None)
            held = self.decided
            self.decided = Decided(
                event.budget, held.ceiling if held else None, held.enforced if held else None
            )
        self.reservations[(event.owner, event.key)] = Held(
            event.key, event.bytes, event.owner, event.token, event.pid, event.create_time
        )

    def by_key(self) -> dict[str, Held]:
        """Each engine key's reservation (of the owner that took it last, when two hold one)."""
        return {held.key: held for held in self.reservations.values()}

    def owners(self) -> set[str]:
        """Every owner holding something."""
        return {h.owner for h in self.reservations.values()}

    def copy(self) -> LedgerState:
        """An independent copy (for trial decisions)."""
        return LedgerState(
            dict(self.reservations),
            self.explicit_budget,
            self.spillover,
            self.version,
            self.decided,
            self.budget_source,
        )


@dataclass(frozen=True, slots=True)
class LedgerLimits:
    """The limits in force: derived from the automatic budget and the operator's settings.

    Attributes:
        enforced: False when an explicit budget under 1 GiB was set (everything is granted).
        budget: The admission budget in bytes.
        fast_budget: The accelerator budget (lowered, never raised, by an explicit budget).
        spillover_allowed: Whether co-resident models may spill from the card into RAM.
        ceiling: The co-residency ceiling: the budget, or the fast budget without spillover.
        origin: Where the budget was set, for the refusals that ask for more (a what-if's or
            a verification's limits say nothing: automatic).
    """

    enforced: bool
    budget: int
    fast_budget: int
    spillover_allowed: bool
    ceiling: int
    origin: BudgetOrigin = AUTOMATIC_ORIGIN


def limits_of(state: LedgerState, auto: CapacityBudget) -> LedgerLimits:
    """CB1 and CB4: the limits a state and the automatic budget put in force."""
    explicit = state.explicit_budget
    enforced = explicit is None or explicit >= ENFORCE_MINIMUM
    budget = auto.budget if explicit is None else explicit
    fast = auto.fast if explicit is None or not enforced else min(auto.fast, explicit)
    spillover = auto.ram_spillover_auto if state.spillover is None else state.spillover
    ceiling = budget if spillover else min(budget, fast)
    origin = origin_of(explicit, state.budget_source, auto)
    return LedgerLimits(enforced, budget, fast, spillover, ceiling, origin)


def shortfall(limits: LedgerLimits, committed: int, wanted: int, prior: int = 0) -> int:
    """CB5: bytes that must be released before ``wanted`` fits (0 when it fits).

    ``prior`` is the reservation the same key already holds (it is being resized). The
    co-residency ceiling binds only while something else is resident: one model alone may use
    the whole budget.
    """
    if not limits.enforced:
        return 0
    others = max(0, committed - prior)
    budget_short = others + wanted - limits.budget
    if others > 0:
        co_short = min(others, others + wanted - limits.ceiling)
        return max(0, budget_short, co_short)
    return max(0, budget_short)


def denial_reason(limits: LedgerLimits, would_commit: int) -> str:
    """CB8: the stable, machine-shaped denial line."""
    if limits.enforced and limits.ceiling < limits.budget and would_commit > limits.ceiling:
        return f"budget exhausted: would commit {would_commit} against {limits.ceiling}" + (
            CO_RESIDENCY_SUFFIX
        )
    return f"budget exhausted: would commit {would_commit} against {limits.budget}"


@dataclass(frozen=True, slots=True)
class ReserveDecision:
    """The answer to one reserve request, with every input that produced it."""

    key: str
    bytes: int
    owner: str
    granted: bool
    prior: int
    committed_other: int
    shortfall: int
    reason: str
    budget: int
    ceiling: int
    enforced: bool
    token: str | None = None

    def event(self) -> LedgerReserved | LedgerDenied:
        """The event that records this decision."""
        if self.granted:
            return LedgerReserved(
                key=self.key,
                bytes=self.bytes,
                owner=self.owner,
                prior=self.prior,
                committed_other=self.committed_other,
                budget=self.budget,
                ceiling=self.ceiling,
                enforced=self.enforced,
                token=self.token,
            )
        return LedgerDenied(
            key=self.key,
            bytes=self.bytes,
            owner=self.owner,
            shortfall=self.shortfall,
            reason=self.reason,
            committed_other=self.committed_other,
            budget=self.budget,
            ceiling=self.ceiling,
        )


def decide_reserve(  # noqa: PLR0917 - the rule's inputs, in the order CB7 names them
    state: LedgerState,
    auto: CapacityBudget,
    key: str,
    wanted: int,
    owner: str,
    token: str | None = None,
) -> ReserveDecision:
    """CB7: grant (replacing this owner's prior for the key) or deny, keeping the prior intact.

    Another owner's reservation for the same key is someone else's engine (OW1): it counts
    against the budget like any other.
    """
    if wanted < 0:
        raise ValueError(f"cannot reserve a negative amount ({wanted}) for {key!r}")
    limits = limits_of(state, auto)
    held = state.held(owner, key)
    prior = held.bytes if held else 0
    committed = state.committed
    short = shortfall(limits, committed, wanted, prior)
    others = max(0, committed - prior)
    granted = short <= 0
    return ReserveDecision(
        key=key,
        bytes=wanted,
        owner=owner,
        granted=granted,
        prior=prior,
        committed_other=others,
        shortfall=max(0, short),
        reason="" if granted else denial_reason(limits, others + wanted),
        budget=limits.budget,
        ceiling=limits.ceiling,
        enforced=limits.enforced,
        token=token,
    )


def decide_adopt(
    state: LedgerState,
    auto: CapacityBudget,
    *,
    key: str,
    owner: str,
    wanted: int,
    token: str | None,
    pid: int,
    create_time: float,
) -> LedgerAdopted:
    """OW3: take over a running engine's memory; never denied, since it is already in use.

    The reservation that paid for the engine (found by its launch token) moves to ``owner``
    with the adopter's figure; when nothing paid for it, the engine is recorded anyway and
    ``over_budget`` says by how much the ledger is now over, so the runtime can make room.
    """
    if wanted < 0:
        raise ValueError(f"cannot adopt a negative amount ({wanted}) for {key!r}")
    previous = state.by_token(token) if token else None
    trial = state.copy()
    if previous is not None:
        trial.reservations.pop(previous.slot, None)
    trial.reservations.pop((owner, key), None)
    limits = limits_of(state, auto)
    others = trial.committed
    over = max(0, others + wanted - limits.budget) if limits.enforced else 0
    return LedgerAdopted(
        key=key,
        owner=owner,
        bytes=wanted,
        from_owner=previous.owner if previous else None,
        token=token,
        pid=pid,
        create_time=create_time,
        committed_other=others,
        budget=limits.budget,
        over_budget=over,
    )


def fallback_resident_bytes(engine: str, size: int, mmproj: int = 0) -> int:
    """CB11: a resident estimate from on-disk size alone (KV excluded), per engine kind."""
    mib = 1024**2
    if engine in {"llamacpp", "llama-cpp"}:
        return (
            round_half_up(11 * (size + mmproj), 10) + 256 * mib + (384 * mib if mmproj > 0 else 0)
        )
    if engine == "mlx":
        return round_half_up(102 * size, 100) + 1024 * mib
    if engine == "ds4":
        return min(size, 48 * GIB)
    return round_half_up(11 * size, 10) + 256 * mib


def _gib(value: int) -> str:
    return f"{format_half_up(value, 1, per=GIB)} GiB"


def format_denial(
    model: str,
    wanted: int,
    limits: LedgerLimits,
    committed_other: int,
    *,
    below_minimum: bool = False,
    window: str = "",
) -> str:
    """CB12: the denial a person reads (GiB with one decimal, never raw byte counts).

    It ends saying where the budget was set and how to raise it there (:func:`raise_hint`).

    ``window`` is C6's statement of the window required and what one slot could hold
    (:func:`hostler.capacity.context.window_denial`), added when ``below_minimum``.
    """
    if limits.enforced and limits.ceiling < limits.budget and committed_other > 0:
        return (
            f"{model} needs {_gib(wanted)}, and hostler keeps co-resident models on the graphics "
            f"card ({_gib(limits.ceiling)}), where other models hold {_gib(committed_other)} "
            "and are busy. Wait for them to finish, or allow RAM spillover."
        )
    available = max(0, limits.budget - committed_other)
    text = f"{model} needs {_gib(wanted)} but {_gib(available)} is available"
    if committed_other > 0:
        text += f"; other models hold {_gib(committed_other)}"
    if below_minimum:
        text += "; even one slot at the minimum context window does not fit"
        text += f" ({window})" if window else ""
    return f"{text}. {raise_hint(limits.origin, limits.budget)}; or unload a model."


def committed_snapshot(
    state: LedgerState, auto: CapacityBudget, owners_alive: Iterable[str] | None = None
) -> dict[str, Any]:
    """CB10: the ledger as a dict (reservations sorted by bytes, largest first)."""
    limits = limits_of(state, auto)
    alive = None if owners_alive is None else set(owners_alive)
    return {
        "budget": limits.budget,
        "committed": state.committed,
        "enforced": limits.enforced,
        "system_ram": auto.system_ram,
        "auto_budget": auto.budget,
        "overridden": state.explicit_budget is not None or auto.overridden,
        "pools": {
            "kind": str(auto.kind),
            "vram": auto.vram,
            "ram_share": auto.ram_share,
            "fast": limits.fast_budget,
            "concurrency_sizing": auto.concurrency_sizing,
        },
        "ram_spillover": {
            "allowed": limits.spillover_allowed,
            "auto": auto.ram_spillover_auto,
            "overridden": state.spillover is not None,
            "co_residency_bytes": limits.ceiling,
        },
        "by_key": [
            {
                "key": h.key,
                "bytes": h.bytes,
                "owner": h.owner,
                "pid": h.pid,
                **({} if alive is None else {"owner_alive": h.owner in alive}),
            }
            for h in sorted(state.reservations.values(), key=lambda h: (-h.bytes, h.key, h.owner))
        ],
    }


def committed_other_for(state: LedgerState, engine: str, model: str) -> int:
    """NR6: what everyone but this model's own replicas holds.

    A preview must not count the model against itself; keys that do not parse stay counted
    (conservative).
    """
    total = 0
    for held in state.reservations.values():
        parsed = parse_key(held.key)
        if parsed is not None and parsed.engine == engine and parsed.model == model:
            continue
        total += held.bytes
    return total


def state_from(events: Iterable[Event], version: int = 0) -> LedgerState:
    """Fold events into a fresh state (tests and tools)."""
    state = LedgerState(version=version)
    for event in events:
        state.apply(event)
    return state
