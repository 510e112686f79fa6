"""The daemon's offered models: the configured ones, and those discovery finds while it runs.

:class:`Catalog` is the one answer to "which models does this daemon offer": the HTTP face
reads it as its model table (model id → ``engine:model``, live), the engine factory asks it
for a discovered model's engine (:meth:`Catalog.engine_config`), and start-up asks it which
adopted engines still have an owner (OW5).

Discovery is a loop of observation → pure decision → record → act: the walk
(:func:`hostler.drivers.model_walk.walk_places`, off the loop) observes the files, the plan
(:func:`hostler.policies.offer.plan_offer`) decides the offer, a changed offer is recorded
(``models.offered``, stream ``models/host``) and only then served. A restart replays that
stream first, so every file keeps its id (MD2). A rescan that cannot be recorded changes
nothing (the next one tries again).

A model whose file vanished (MD6) is no longer offered: a request naming it gets 404. An
engine already running it is not stopped: its requests finish, and it leaves at its idle
stop, an eviction or an unload like any engine; it is never started again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hostler.capacity.keys import parse_key
from hostler.clock import Clock
from hostler.config import DaemonConfig, EngineConfig
from hostler.drivers.model_walk import recorded_offer, survey
from hostler.drivers.offloop import OffLoop
from hostler.errors import HostlerError
from hostler.events.discovery import MODELS_STREAM, ModelsOffered
from hostler.policies.offer import Offer, Offered, Refusal, offer_changes
from hostler.store.log import EventStore

__all__ = ["SETTLE", "Catalog"]

log = logging.getLogger("hostler.daemon")  # the daemon's records keep its logger's name

#: MD7: a file written within this many seconds is not offered yet (a copy in progress).
SETTLE = 2.0
#: The refusals one ``models.offered`` keeps (the rest are counted).
RECORDED_REFUSALS = 100


@dataclasses.dataclass(frozen=True, slots=True)
class _Model:
    """One offered model: its engine target and what ``GET /v1/models`` says of it."""

    target: str
    source: str
    size: int | None


class Catalog(Mapping[str, str]):
    """The models this daemon offers, model id → ``engine:model`` (a live, read-only view).

    Args:
        config: The daemon's settings: its configured engines and ``discovery``.
        store: The event log the offer is recorded in.
        clock: The clock (the walk's time, the rescan's pace).
        offloop: Where the walk and the log work run.
    """

    def __init__(
        self, config: DaemonConfig, store: EventStore, *, clock: Clock, offloop: OffLoop
    ) -> None:
        self._discovery = config.discovery
        self._store = store
        self._clock = clock
        self._io = offloop
        self._configured: dict[str, _Model] = {}
        self._files: dict[str, Path] = {}
        for engine in config.engines:
            parsed = parse_key(engine.key)
            if parsed is not None and parsed.model not in self._configured:
                self._configured[parsed.model] = _Model(
                    f"{parsed.engine}:{parsed.model}", "config", None
                )
                self._files[parsed.model] = engine.model
        self._offer = Offer((), ())
        self._refused: tuple[Refusal, ...] = ()
        self._models: dict[str, _Model] = dict(self._configured)

    # -- the mapping the HTTP face reads -------------------------------------------------------

    def __getitem__(self, model: str) -> str:
        """The ``engine:model`` that serves ``model``."""
        return self._models[model].target

    def __iter__(self) -> Iterator[str]:
        """Every offered model id."""
        return iter(self._models)

    def __len__(self) -> int:
        """How many models are offered."""
        return len(self._models)

    def about(self, model: str) -> dict[str, Any]:
        """What ``GET /v1/models`` adds for ``model``: its ``source`` and ``size_bytes``."""
        entry = self._models.get(model)
        if entry is None:
            return {}
        return {"source": entry.source, "size_bytes": entry.size}

    # -- the engine factory's question ---------------------------------------------------------

    def engine_config(self, key: str) -> EngineConfig | None:
        """The engine of a discovered model's ``key`` (any replica), None when not offered."""
        parsed = parse_key(key)
        if self._discovery is None or parsed is None or parsed.model in self._configured:
            return None
        offered = next((m for m in self._offer.offered if m.id == parsed.model), None)
        if offered is None or parsed.engine != "llamacpp":
            return None
        return dataclasses.replace(self._discovery.template, key=key, model=Path(offered.path))

    # -- the walk -------------------------------------------------------------------------------

    async def open(self) -> None:
        """The first walk, after the recorded offer is replayed (MD2), before anything serves.

        Sizes the configured models' files too. A walk that cannot be recorded is said in
        the log and leaves the recorded offer (the next rescan tries again).
        """
        sizes = await self._io.run(_sizes, self._files)
        for model, size in sizes.items():
            self._configured[model] = dataclasses.replace(self._configured[model], size=size)
            self._models[model] = self._configured[model]
        if self._discovery is None:
            return
        store = self._store
        recorded = await self._io.run_patiently(lambda: recorded_offer(store))
        self._apply(Offer(recorded, ()), ())
        await self.scan()

    async def run(self) -> None:
        """Walk again every ``rescan_seconds`` until cancelled (none when it is 0 or off)."""
        discovery = self._discovery
        if discovery is None or discovery.rescan_seconds <= 0:
            return
        while True:
            await self._clock.sleep(discovery.rescan_seconds)
            try:
                await self.scan()
            except Exception:  # a bug in one walk must not end the daemon's other work
                log.exception("hostler: model discovery failed; it runs again shortly")

    async def scan(self) -> bool:
        """Walk the places, plan the offer, record it when it changed, then serve it.

        Returns whether the offer changed (False as well when it could not be recorded).
        """
        discovery = self._discovery
        if discovery is None:
            return False
        before, taken = self._offer.offered, set(self._configured)
        now = self._clock.wall()  # a file written since is younger than SETTLE: not yet
        surveyed = await self._io.run(
            lambda: survey(discovery.places, before=before, taken=taken, now=now, settle=SETTLE)
        )
        offer, refused = surveyed.offer, surveyed.refused
        added, removed = offer_changes(self._offer.offered, offer.offered)
        if not added and not removed and set(refused) == set(self._refused):
            return False
        event = ModelsOffered(
            now,
            [dataclasses.asdict(m) for m in added],
            [dataclasses.asdict(m) for m in removed],
            [dataclasses.asdict(r) for r in refused[:RECORDED_REFUSALS]],
            max(0, len(refused) - RECORDED_REFUSALS) + surveyed.more_refused,
        )
        store = self._store
        try:
            await self._io.run(lambda: store.append(MODELS_STREAM, [event], expected_version=None))
        except HostlerError as exc:  # not recorded, not acted on: the next walk tries again
            log.warning("hostler: the models found were not recorded (%s)", exc.message)
            return False
        self._say(added, removed, refused)
        self._apply(offer, refused)
        return True

    def _apply(self, offer: Offer, refused: tuple[Refusal, ...]) -> None:
        """Serve ``offer``: the configured models, then the discovered ones (one step)."""
        self._offer = offer
        self._refused = refused
        models = dict(self._configured)
        for model in offer.offered:
            models[model.id] = _Model(f"llamacpp:{model.id}", model.source, model.size)
        self._models = models

    def _say(
        self, added: list[Offered], removed: list[Offered], refused: tuple[Refusal, ...]
    ) -> None:
        """One log line per model that changed, and one per new refusal.

        A model withdrawn and offered again under its id and file (the file replaced) is one
        line; an id that goes to another file is two (the old file's, then the new one's).
        """
        again = {(m.id, m.path) for m in added} & {(m.id, m.path) for m in removed}
        for model in removed:
            if (model.id, model.path) not in again:
                log.info(
                    "hostler: no longer offering %s (%s is gone, or no longer searched)",
                    model.id,
                    model.path,
                )
        for model in added:
            verb = "offering again, changed," if (model.id, model.path) in again else "offering"
            log.info("hostler: %s %s (%s: %s)", verb, model.id, model.source, model.path)
        for refusal in sorted(set(refused) - set(self._refused), key=lambda r: r.path):
            log.warning("hostler: not offered: %s: %s", refusal.path, refusal.reason)


def _sizes(files: Mapping[str, Path]) -> dict[str, int | None]:
    """Each configured model's size in bytes (None: not a file hostler can read now)."""
    sizes: dict[str, int | None] = {}
    for model, path in files.items():
        try:
            sizes[model] = path.stat().st_size
        except OSError:
            sizes[model] = None
    return sizes
