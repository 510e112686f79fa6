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
from collections.abc import Callable

from hostler.capacity.keys import make_key, parse_key
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
        clock: Wall-clock seconds (injected in tests).
        offloop: Where log writes run.
    """

    def __init__(
        self, pool: Pool, *, clock: Callable[[], float] = time.time, offloop: OffLoop | None = None
    ) -> None:
        self.pool = pool
        self._clock = clock
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
        router's own memory of it is used.

        Raises:
            HostlerError: The chosen engine cannot be started (capacity, busy, start failure).
        """
        prior = prior_key or self._bound.get(session)
        parsed = parse_key(prior) if prior else None
        if (
            prior is not None
            and parsed is not None
            and (parsed.engine, parsed.model)
            == (
                engine,
                model,
            )
        ):
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
        counts = self.session_counts()
        running = self.pool.peek(engine, model)
        entries = [PoolEntry(key, 0, 0.0) for key in sorted(running)]
        choice = pick_replica(entries, counts)
        key = choice if choice is not None else make_key(engine, model, 0)
        await self.pool.ensure(key, cause="session")
        await self._remember(session, key, "balanced" if choice else "first", counts, running)
        return key

    async def one_shot(self, engine: str, model: str) -> str:
        """ER3: a running replica of the model (most recently used), else replica 0 started."""
        running = self.pool.peek(engine, model)
        key = running[0] if running else make_key(engine, model, 0)
        await self.pool.ensure(key, cause="one-shot")
        return key

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
        event = SessionBound(self._clock(), session, key, how, tally)
        store = self.pool.store
        try:
            await self._io.run(lambda: store.append(ROUTER_STREAM, [event], expected_version=None))
        except HostlerError as exc:  # affinity is a preference: a binding never fails on it
            log.warning("hostler: session %s: binding not recorded (%s)", session, exc.message)
