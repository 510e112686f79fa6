"""The engine router (anyio driver): which replica of a model serves a session.

A session keeps its engine (its prompt cache lives there): asked again, it gets the same engine
key, started again at the same replica index if it was stopped meanwhile (ER2). A new session
goes to the replica with the fewest sessions (PP11); a one-shot call reuses a running replica and
never starts a second copy just for itself (ER3). Each new binding is recorded
(``router.bound``, stream ``router/host``) with the session counts it was chosen from, so a
post-mortem can say why a session landed where it did.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from hostler.capacity.keys import make_key, parse_key
from hostler.clock import ClockLike, as_clock
from hostler.drivers.offloop import OffLoop
from hostler.errors import HostlerError
from hostler.events.router import ROUTER_STREAM, SessionBound
from hostler.policies.pool import PoolEntry, pick_replica
from hostler.runtime.pool import Pool

__all__ = ["ROUTER_STREAM", "Router", "SessionBound"]

log = logging.getLogger(__name__)


class Router:
    """Binds sessions to engine keys over a :class:`~hostler.runtime.pool.Pool`.

    Args:
        pool: The pool that builds and holds the engines.
        clock: The clock (wall time for the binding records).
        offloop: Where log writes run.
    """

    def __init__(
        self, pool: Pool, *, clock: ClockLike = time.time, offloop: OffLoop | None = None
    ) -> None:
        self.pool = pool
        self._clock = as_clock(clock)
        self._io = offloop or OffLoop()
        self._bound: dict[str, str] = {}

    @property
    def sessions(self) -> dict[str, str]:
        """Every bound session and its engine key (a copy)."""
        return dict(self._bound)

    def session_counts(self) -> Counter[str]:
        """Sessions per engine key."""
        return Counter(self._bound.values())

    async def bind(
        self, engine: str, model: str, session: str, *, prior_key: str | None = None
    ) -> str:
        """ER2: the engine key that serves ``session``, started (and made room for) if needed.

        ``prior_key`` is the key the caller persisted for the session, if any; otherwise the
        router's own memory of it is used. A prior replica that cannot be started again
        gives way to a fresh choice (PP11).

        Raises:
            HostlerError: The chosen engine cannot be started (capacity, busy, start failure).
        """
        prior = self._prior(engine, model, session, prior_key)
        if prior is not None:
            was_up = self.pool.resident(prior)
            try:
                await self.pool.ensure(prior, cause="session")
            except HostlerError as exc:
                if was_up:
                    raise
                log.warning("hostler: %s: cannot respawn for %s: %s", prior, session, exc.message)
            else:
                await self._remember(session, prior, "kept" if was_up else "respawned")
                return prior
        key, how, counts, running = self._choose(engine, model)
        await self.pool.ensure(key, cause="session")
        await self._remember(session, key, how, counts, running)
        return key

    async def place(self, engine: str, model: str, session: str | None) -> str:
        """The engine key that will serve one request, chosen and recorded, nothing started.

        The request's own queue slot starts it (:meth:`hostler.runtime.facade.Runtime.request`),
        so the request is in the log, queued, before any engine is started for it. With a
        session: its prior replica (ER2: ``kept`` when up, ``respawned`` when not), else the
        replica with the fewest sessions (PP11). Without: ER3's running replica, else
        replica 0.
        """
        if session is None:
            running = self.pool.peek(engine, model)
            return running[0] if running else make_key(engine, model, 0)
        prior = self._prior(engine, model, session, None)
        if prior is not None:
            await self._remember(
                session, prior, "kept" if self.pool.resident(prior) else "respawned"
            )
            return prior
        key, how, counts, running = self._choose(engine, model)
        await self._remember(session, key, how, counts, running)
        return key

    async def one_shot(self, engine: str, model: str) -> str:
        """ER3: a running replica of the model (most recently used), else replica 0 started."""
        key = await self.place(engine, model, None)
        await self.pool.ensure(key, cause="one-shot")
        return key

    def _prior(self, engine: str, model: str, session: str, prior_key: str | None) -> str | None:
        """The session's earlier key when it names this same model, else None."""
        prior = prior_key or self._bound.get(session)
        parsed = parse_key(prior) if prior else None
        if prior is None or parsed is None or (parsed.engine, parsed.model) != (engine, model):
            return None
        return prior

    def _choose(self, engine: str, model: str) -> tuple[str, str, Counter[str], list[str]]:
        """PP11: a new session's replica (the fewest sessions, else replica 0), and its inputs.

        Returns the key, how it was chosen, and the session counts and running replicas it
        was chosen from (what ``router.bound`` records).
        """
        counts = self.session_counts()
        running = self.pool.peek(engine, model)
        entries = [PoolEntry(key, 0, 0.0) for key in sorted(running)]
        choice = pick_replica(entries, counts)
        key = choice if choice is not None else make_key(engine, model, 0)
        return key, "balanced" if choice else "first", counts, running

    def unbind(self, session: str) -> bool:
        """Forget a session (it ended); whether it was bound."""
        return self._bound.pop(session, None) is not None

    async def _remember(
        self,
        session: str,
        key: str,
        how: str,
        counts: Counter[str] | None = None,
        running: list[str] | None = None,
    ) -> None:
        if self._bound.get(session) == key and how == "kept":
            return  # nothing new to record
        self._bound[session] = key
        tally = {k: (counts or Counter()).get(k, 0) for k in (running or [key])}
        event = SessionBound(self._clock.wall(), session, key, how, tally)
        store = self.pool.store
        try:
            await self._io.run(lambda: store.append(ROUTER_STREAM, [event], expected_version=None))
        except HostlerError as exc:  # affinity is a preference: a binding never fails on it
            log.warning("hostler: session %s: binding not recorded (%s)", session, exc.message)
