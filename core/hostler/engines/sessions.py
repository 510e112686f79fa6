"""An engine's sessions across its stops (CC13): its launch's cache adapter, and the saves.

Each launch gets its prompt-cache adapter from its plugin once (L16), kept with the run
(:class:`~hostler.engines.child.EngineChild`): the runtime registers that one with the cache
controller, and the stop saves through that one. Before a stop of an engine that still answers
(:func:`hostler.policies.cache.saves_before_stop`) every session it holds is written to its
file, within :func:`~hostler.policies.cache.save_bound`; each save, or why there was none, is
recorded on the engine's cache stream (``cache.saved``). A save that fails or runs out of time
costs that session a cold next turn, never the stop.
"""

from __future__ import annotations

import logging

from hostler.engines.child import EngineChild
from hostler.engines.hold import EngineParts
from hostler.errors import PluginError
from hostler.events.cache import CacheSaved, cache_stream
from hostler.plugin import CacheAdapter, SessionCache, SessionSaved
from hostler.policies.cache import save_bound, saves_before_stop

__all__ = ["launch_cache", "save_sessions"]

log = logging.getLogger(__name__)


def launch_cache(parts: EngineParts, child: EngineChild) -> CacheAdapter | None:
    """The run's prompt-cache adapter, asked of its plugin once per launch (L16).

    None when the engine has none, the run was adopted (no launch spec to size it by), or the
    plugin raised (its bug costs the cache, never the engine).
    """
    if not child.cache_made:
        child.cache_made = True
        if child.spec is not None:
            adapter = parts.guard.adapter
            try:
                child.cache = parts.guard.call("cache_adapter", adapter.cache_adapter, child.spec)
            except PluginError as exc:
                log.warning("hostler: %s", exc.message)
    return child.cache


async def save_sessions(parts: EngineParts, child: EngineChild, reason: str) -> None:
    """CC13: before a stop for ``reason``, the sessions the engine holds saved to their files.

    Nothing for a stop that saves nothing, or a run whose adapter cannot save. The most
    recently used first, all within :func:`~hostler.policies.cache.save_bound`; each saved,
    failed or left unsaved when the time ran out is recorded (``cache.saved``), off the loop.
    """
    cache = child.cache
    if not saves_before_stop(reason) or not isinstance(cache, SessionCache):
        return
    bound = save_bound(reason)
    deadline = parts.clock.monotonic() + bound
    try:
        held: list[object] = list(cache.held_sessions())  # a plugin's answer: checked
    except Exception:  # a plugin's bug costs the sessions their files, never the stop
        log.exception("hostler: %s: its cache adapter's held_sessions raised", parts.key)
        return
    events = []
    for session in held:
        if not isinstance(session, str):
            continue
        saved = await _save_one(cache, session, deadline - parts.clock.monotonic(), parts)
        if saved is None:
            saved = SessionSaved(
                session, error=f"not saved: the stop's {bound:g} s for saves ran out"
            )
        events.append(
            CacheSaved(
                parts.key, session, reason, saved.tokens, saved.bytes, saved.seconds,
                saved.error, saved.used_at,
            )
        )  # fmt: skip
    if events:
        store = parts.journal.store
        stream = cache_stream(parts.key)
        await parts.io.run(lambda: store.append(stream, events, expected_version=None))


async def _save_one(
    cache: SessionCache, session: str, left: float, parts: EngineParts
) -> SessionSaved | None:
    """One session saved within ``left`` seconds; None when the time ran out first."""
    if left <= 0:
        return None
    with parts.clock.move_on_after(left):
        try:
            saved = await cache.save_session(session)
        except Exception as exc:  # a plugin's bug costs this session its file, never the stop
            log.exception("hostler: %s: saving session %s raised", parts.key, session[:64])
            return SessionSaved(session, error=f"the plugin raised {type(exc).__name__}")
        answer: object = saved  # a plugin's answer: checked
        if isinstance(answer, SessionSaved):
            return answer
        return SessionSaved(session, error="the plugin answered no SessionSaved")
    return None
