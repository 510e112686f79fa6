"""``hostler explain``'s sentences for a session's prompt cache: saved, restored, dropped (CC13).

A session's turn on an engine that no longer held its cache (the engine was evicted, stopped
or restarted) reads only its new tokens when its cache was saved before the stop and restored
before the turn; these findings tell which happened, when and why, so "why was my
conversation slow after lunch?" has an answer in the log.
"""

from __future__ import annotations

from hostler.events.cache import CacheEvicted, CacheRestored, CacheSaved
from hostler.postmortem.explain_wording import secs, size
from hostler.postmortem.findings import Finding, Target, cite
from hostler.store.log import RecordedEvent

__all__ = ["CacheSentences"]

#: What a save came before, as a person says it.
_BEFORE = {
    "evicted": "before its engine was evicted",
    "idle": "before its engine's idle stop",
    "memory-pressure": "before its engine's stop for memory pressure",
    "user": "before its engine was unloaded",
    "shutdown": "before the daemon shut down",
    "unconfigured": "before its engine, no longer configured, was stopped",
    "slot-recycled": "when another session took its slot",
}


class CacheSentences:
    """The cache story of the target session, or of the sessions of the target engines.

    Args:
        target: What is explained.
    """

    def __init__(self, target: Target) -> None:
        self._target = target

    def _mine(self, key: str, session: str) -> bool:
        target = self._target
        if target.kind == "session":
            return session == target.session
        return target.kind in ("engine", "model") and key in target.keys

    def on_cache(
        self, record: RecordedEvent, event: CacheSaved | CacheRestored | CacheEvicted
    ) -> Finding | None:
        """The finding a cache event makes for the target, or None."""
        if isinstance(event, CacheSaved):
            return self.on_saved(record, event)
        if isinstance(event, CacheRestored):
            return self.on_restored(record, event)
        return self.on_evicted(record, event)

    def on_saved(self, record: RecordedEvent, event: CacheSaved) -> Finding | None:
        """A session's cache written to its file before a stop (or not)."""
        if not self._mine(event.key, event.session):
            return None
        before = _BEFORE.get(event.cause, f"before a stop ({event.cause})")
        if event.error:
            text = (
                f"session {event.session}'s prompt cache was NOT saved on {event.key} {before}: "
                f"{event.error}; its next turn there reads its whole prompt again"
            )
        else:
            text = (
                f"session {event.session}'s prompt cache saved on {event.key} {before}: "
                f"{event.tokens} tokens, {size(event.bytes)}, in {secs(event.seconds)}"
            )
        return cite(
            record,
            f"session {event.session}",
            "cache-saved",
            text,
            engine=event.key,
            cause=event.cause,
            tokens=event.tokens,
            bytes=event.bytes,
            seconds=event.seconds,
            error=event.error,
        )

    def on_restored(self, record: RecordedEvent, event: CacheRestored) -> Finding | None:
        """A session's cache restored from its file before its turn (or the restore failed)."""
        if not self._mine(event.key, event.session):
            return None
        if event.error:
            text = (
                f"session {event.session}'s prompt cache could not be restored on {event.key}: "
                f"{event.error}; the turn read its whole prompt"
            )
        else:
            text = (
                f"session {event.session}'s prompt cache restored on {event.key} before its "
                f"turn: {event.tokens} tokens in {secs(event.seconds)}"
            )
        return cite(
            record,
            f"session {event.session}",
            "cache-restored",
            text,
            engine=event.key,
            tokens=event.tokens,
            seconds=event.seconds,
            error=event.error,
        )

    def on_evicted(self, record: RecordedEvent, event: CacheEvicted) -> Finding | None:
        """Sessions' caches dropped from an engine (its budget, an invalidation, a clear)."""
        target = self._target
        why = _dropped_because(event)
        if target.kind == "session":
            if target.session not in event.ids:
                return None
            text = (
                f"session {target.session}'s prompt cache dropped from {event.key}: {why}; "
                "its next turn there reads its whole prompt again"
            )
        elif target.kind in ("engine", "model") and event.key in target.keys:
            text = f"{len(event.ids)} session cache(s) dropped from {event.key}: {why}"
        else:
            return None
        return cite(
            record,
            event.key,
            "cache-dropped",
            text,
            sessions=list(event.ids),
            reason=event.reason,
            decision=event.decision,
        )


def _dropped_because(event: CacheEvicted) -> str:
    """Why sessions' caches were dropped, in words, from the decision's inputs."""
    decision = event.decision
    if event.reason == "watermark":
        budget, total = decision.get("budget"), decision.get("total")
        after = decision.get("total_after")
        if (
            isinstance(budget, int | float)
            and isinstance(total, int | float)
            and isinstance(after, int | float)
        ):
            where = "saved files" if decision.get("running") is False else "caches"
            return (
                f"its engine's {where} reached their budget ({size(int(total))} of "
                f"{size(int(budget))}), least recently used first, down to {size(int(after))}"
            )
        return "its engine's cache budget was reached"
    if event.reason == "invalidated":
        return "its saved file was gone, or made by another model file or engine build"
    if event.reason == "invalidate":
        return "an operator evicted the session"
    if event.reason == "clear":
        return "an operator cleared the engine's cache"
    return event.reason
