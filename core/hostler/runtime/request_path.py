"""One request, end to end (EG4): queue, GPU slot, engine, physical gate, in that order.

:class:`RequestPath` holds an engine for one request the way docs/runtime.md tells it: the
engine's request queue, the GPU's slot from the arbiter (an ``image``/``video`` engine's
exclusive lease first, GA8), the engine from the pool (built and made room for if needed),
and the gate as wide as the engine's launched slots; it records ``queue.served`` with the
client's whole wait, and counts the requests still inside so a closing runtime can let them
record their end (their queue events end the log).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from hostler.clock import Clock
from hostler.errors import RuntimeClosedError, UsageError
from hostler.events.queue import QueueServed
from hostler.plugin import SessionPrepared
from hostler.policies.queue import Lane
from hostler.runtime.arbiter import GpuArbiter
from hostler.runtime.lanes import EngineLanes
from hostler.runtime.pool import Pool
from hostler.runtime.prompt_caches import PromptCaches
from hostler.runtime.slots import gpu_slot
from hostler.runtime.writer import QueueEventWriter

__all__ = ["Held", "RequestPath"]

log = logging.getLogger(__name__)


def _told(on_wait: Callable[[int], None]) -> Callable[[int], None]:
    """A caller's progress callback that may raise: its bug costs the display, not the request."""

    def tell(ahead: int) -> None:
        try:
            on_wait(ahead)
        except Exception:
            log.exception("hostler: a request's on_wait callback raised")

    return tell


@dataclass(frozen=True, slots=True)
class Held:
    """An engine held for one request.

    Attributes:
        port: The engine's loopback port.
        prepared: For a request of a session on an engine with a prompt cache: where its
            cache comes from and the fields its body must carry (None otherwise).
    """

    port: int
    prepared: SessionPrepared | None = None

    @property
    def fields(self) -> dict[str, Any]:
        """What the request's body must carry besides the client's own fields."""
        return {} if self.prepared is None else dict(self.prepared.fields)


class RequestPath:
    """EG4: what a request takes, in order, and gives back in reverse however it ends.

    Args:
        pool: The runtime's engines.
        lanes: Each engine's queue and gate.
        caches: Registers the cache adapter of each launch its first request reaches (L16).
        arbiter: The GPU arbiter.
        writer: Where ``queue.served`` goes, and what a start's arrival is written with.
        clock: The runtime's clock.
    """

    def __init__(
        self,
        pool: Pool,
        lanes: EngineLanes,
        caches: PromptCaches,
        *,
        arbiter: GpuArbiter,
        writer: QueueEventWriter,
        clock: Clock,
    ) -> None:
        self._pool = pool
        self._lanes = lanes
        self._caches = caches
        self._arbiter = arbiter
        self._writer = writer
        self._clock = clock
        self._in_flight = 0  # requests inside request(): their queue events end the log
        self._settled = anyio.Event()

    @contextlib.asynccontextmanager
    async def request(
        self,
        key: str,
        *,
        lane: Lane = "interactive",
        session: str | None = None,
        group: str | None = None,
        ambient: bool = False,
        label: str | None = None,
        queue_timeout: float | None = None,
        on_wait: Callable[[int], None] | None = None,
        cause: str = "request",
        prompt_cache: bool = True,
    ) -> AsyncIterator[Held]:
        """Hold ``key``'s engine for one request; yields it held (see ``Runtime.hold``).

        Raises:
            RuntimeClosedError: The runtime is closed.
            UsageError: A malformed lane or ``queue_timeout``.
            QueueTimeoutError: No slot within ``queue_timeout`` seconds; nothing ran.
            QueueCancelledError: An operator cancelled it while queued.
        """
        if self._pool.closed:
            raise RuntimeClosedError("the runtime is closed; it takes no request")
        if lane not in ("interactive", "background"):
            raise UsageError(
                f"a request's lane is interactive or background, not {str(lane)[:20]!r}"
            )
        if queue_timeout is not None and (
            type(queue_timeout) not in (int, float) or math.isnan(queue_timeout)
        ):
            raise UsageError(
                f"queue_timeout is a number of seconds, not {str(queue_timeout)[:20]!r}"
            )
        sup = self._pool.supervisor(key)  # one this runtime can build, or its error: no queue
        queued = self._lanes.queue(key).acquire(
            lane=lane,
            session_id=session,
            group=group,
            ambient=ambient,
            label=label,
            queue_timeout=queue_timeout,
            on_wait=None if on_wait is None else _told(on_wait),
        )
        # GA8: image/video work takes its lease first and lets it go last, after its queue slot,
        # so that the slot it hands the card to finds the engine idle and can unload it (GA2);
        # llm work takes its place in the queue, then the GPU slot. Then the engine.
        slot = gpu_slot(sup)
        self._in_flight += 1
        try:
            async with (
                self._lease(slot, key),
                queued as ticket,
                self._acquire(slot),
                self._arrival_written(key),
                self._pool.use(key, cause) as port,
            ):
                self._lanes.fit(key, sup.launch_spec)
                await self._caches.fit(key)
                async with self._lanes.gate(key).slot():
                    # CC13: a session's cache is ready (restored from its file if need be)
                    # before its turn; its time is part of the client's wait
                    prepared = None
                    if session is not None and prompt_cache:
                        prepared = await self._caches.prepare(key, session)
                        if prepared is not None and prepared.source != "memory":
                            # a restore or a save is in the log before anything that follows
                            # it (a stop's saves are written at once): rare, so written now
                            await self._writer.flush()
                    now = self._clock.wall()
                    waited = round(now - ticket.enqueued_at, 6)
                    served = QueueServed(key, ticket.id, ticket.lane, waited, round(now, 6))
                    self._writer.record_queue(key, served)  # the client's whole wait (PM23)
                    yield Held(port, prepared)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._settled.set()

    async def settle(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for the requests still inside to leave (on closing)."""
        if self._in_flight:
            self._settled = anyio.Event()  # set by the last one out
            with self._clock.move_on_after(wait):
                await self._settled.wait()

    @contextlib.asynccontextmanager
    async def _arrival_written(self, key: str) -> AsyncIterator[None]:
        """Before a start made for a request, its arrival is in the log (PM21).

        Queue events are written in batches (every 0.5 s); a request about to start its
        engine has its own written first, so ``queue.enqueued`` precedes the
        ``engine.start_requested`` made for it in the log's order too. A request for a running
        engine writes nothing here (the hot path stays one batch).
        """
        if not self._pool.resident(key):
            await self._writer.flush()
            await self._caches.forget_stopped()
        yield

    @contextlib.asynccontextmanager
    async def _lease(self, slot: str, key: str) -> AsyncIterator[None]:
        """GA8/I4: the exclusive lease of an ``image``/``video`` request, held for all of it.

        Taken before the engine is started; released, shielded from cancellation, however the
        request ends. ``llm`` work holds no lease (nothing happens here).
        """
        if slot == "llm":
            yield
            return
        release = await self._arbiter.acquire_lease(slot, key)
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                await release()

    @contextlib.asynccontextmanager
    async def _acquire(self, slot: str) -> AsyncIterator[None]:
        """GA2: an ``llm`` request's plain acquire of its slot (lease slots: nothing more)."""
        if slot == "llm":
            await self._arbiter.acquire("llm")
        yield
