"""The story of a daemon, one human line per recorded event that a person cares about.

``hostler serve`` prints it on its terminal (:mod:`hostler.daemon_parts.narrator` feeds it the
daemon's log and its ledger's as they are written): a model loading for a request, ready in so
many seconds, an engine evicted for another and why, a crash and its cause, a refusal and its
reason, the budget changed. Routine events (queue steps, samples, measurements) are detail,
told only at debug level; a line that would repeat the last one of its stream unchanged is not
told again.

:class:`Story` takes each event as the log's event stream gives it (``GET /api/events``'s
``{"seq", "stream", "type", "payload"}``) and folds what later lines need (when a start was
asked, which request arrived for it, the budget last told). It is pure: the one place that
decides the wording; how a stop's or a crash's cause is said is :mod:`explain_wording`'s, as
``hostler explain`` says it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hostler.capacity.cpu_limits import build_fix
from hostler.machines.engine import made_room
from hostler.postmortem.explain_wording import (
    candidates_of,
    crash_how,
    exit_how,
    figures_of,
    mapping_of,
    secs,
    size,
    stop_why,
)

__all__ = ["DETAIL", "STORY", "TROUBLE", "Story", "StoryLine"]

#: The levels of the story's lines, as :mod:`logging` numbers them.
DETAIL = logging.DEBUG
STORY = logging.INFO
TROUBLE = logging.WARNING

#: Causes of a start that a client's request asked for (the router's and the proxy's).
_REQUEST_CAUSES = frozenset({"request", "session", "one-shot"})
#: Events that are routine polling: not even detail (one every few seconds would bury it).
_SILENT = frozenset({"device.sampled"})
#: The longest detail line (a debug line shows a payload, cut here).
_DETAIL_CHARS = 300


@dataclass(frozen=True, slots=True)
class StoryLine:
    """One line of the story: its logging level and its text (the event's seq, when known)."""

    level: int
    text: str
    seq: int | None = None


Telling = Callable[[str, Mapping[str, Any]], "StoryLine | str | None"]


class Story:
    """Folds a daemon's events, in the log's order, into at most one line each.

    Args:
        owner: The daemon's ledger owner: another owner's refusals in a shared ledger are not
            this daemon's story (None: taken from the log's ``daemon.started``).
    """

    def __init__(self, owner: str | None = None) -> None:
        self._owner = owner
        self._asked: dict[str, float] = {}  # engine key -> when its start was asked
        self._pid: dict[str, int] = {}
        self._arrived: dict[str, tuple[Any, Any]] = {}  # engine -> last (request id, session)
        self._budget: tuple[bool, object] = (False, None)  # (told yet, the budget told)
        self._last: dict[str, str] = {}  # stream -> the last line told for it
        # engine keys whose refusal for want of room was told since their last request: the
        # ledger's denial and the pool's unreachable plan are one refusal, told once
        self._refused: set[str] = set()
        self._tellers: dict[str, Telling] = {
            "engine.start_requested": self._start,
            "engine.spawned": self._spawned,
            "engine.ready": self._ready,
            "engine.stop_requested": self._stop,
            "engine.stopped": self._stopped,
            "engine.stop_failed": self._stop_failed,
            "engine.crashed": self._crashed,
            "engine.failed": lambda key, p: _trouble(f"{key} failed — {p.get('error')}"),
            "engine.adopted": self._adopted,
            "engine.lost": lambda key, p: _trouble(f"{key} lost — {p.get('cause')}"),
            "pool.room_planned": self._room,
            "pool.drain_ended": _drain_ended,
            "ledger.denied": self._denied,
            "ledger.budget_set": self._budget_set,
            "ledger.spillover_set": _spillover,
            "queue.enqueued": self._enqueued,
            "queue.cancelled": _cancelled,
            "cache.budget_set": lambda _s, p: (
                f"prompt-cache budget of {p.get('key')} set to {size(p.get('bytes'))}"
            ),
            "lease.broken": lambda stream, p: _trouble(
                f"GPU lease {stream.partition('/')[2]} broken — {p.get('reason')} "
                f"(stale for {secs(p.get('stale_for'))})"
            ),
            "offload.degraded": _degraded,
            "cpu.unsupported": _cpu_unsupported,
            "plugin.failed": lambda _s, p: _trouble(
                f"plugin {p.get('name')} {p.get('version')} failed ({p.get('stage')}) — "
                f"{p.get('error')}"
            ),
            "daemon.started": self._daemon_started,
            "daemon.stopped": lambda _s, p: f"daemon stopped (pid {p.get('pid')})",
            "daemon.gap": lambda _s, p: _trouble(
                f"the previous daemon (pid {p.get('previous_pid')}) ended without a record: "
                f"events after seq {p.get('last_seq')} may be missing"
            ),
            "daemon.log_recovered": lambda _s, p: _trouble(
                f"the event log could not be written for {_span(p)} ({p.get('code')}); "
                f"{p.get('delayed')} events were written late"
            ),
            "daemon.reaped": lambda _s, p: (
                f"stopped a stray engine process no log owns (pid {p.get('pid')})"
            ),
        }

    def tell(self, event: Mapping[str, Any]) -> StoryLine | None:
        """The line ``event`` adds to the story (None: nothing a person needs from it).

        ``event`` is ``{"seq", "stream", "type", "payload"}`` as the event stream sends it;
        anything malformed there is told as detail, never raised.
        """
        kind, stream = str(event.get("type", "")), str(event.get("stream", ""))
        payload = event.get("payload")
        if kind in _SILENT:
            return None
        if not isinstance(payload, Mapping):
            payload = {}
        seq = event.get("seq")
        seq = seq if isinstance(seq, int) else None
        teller = self._tellers.get(kind)
        told = teller(_subject(stream), payload) if teller is not None else None
        if told is None:
            told = _detail(kind, stream, payload)
        line = StoryLine(STORY, told, seq) if isinstance(told, str) else told
        line = StoryLine(line.level, line.text, seq)
        if line.level > DETAIL:
            if self._last.get(stream) == line.text:
                return None  # nothing changed: said already
            self._last[stream] = line.text
        return line

    # -- engines --------------------------------------------------------------------------

    def _start(self, key: str, p: Mapping[str, Any]) -> str:
        self._asked[key] = _number(p.get("at"))
        cause = p.get("cause")
        if p.get("from_state") == "backoff":
            return f"restarting {key} after its crash ({cause})"
        if cause in _REQUEST_CAUSES:
            arrived = self._arrived.pop(key, None)
            if arrived is None:
                return f"loading {key} for a request"
            request, session = arrived
            for_whom = f"request {request}" + (f" (session {session})" if session else "")
            return f"loading {key} for {for_whom}"
        return f"loading {key} ({cause})"

    def _spawned(self, key: str, p: Mapping[str, Any]) -> StoryLine:
        if isinstance(p.get("pid"), int):
            self._pid[key] = p["pid"]
        return StoryLine(DETAIL, f"{key} spawned: pid {p.get('pid')}, port {p.get('port')}")

    def _ready(self, key: str, p: Mapping[str, Any]) -> str:
        asked = self._asked.pop(key, None)
        took = "" if asked is None else f" in {secs(_number(p.get('at')) - asked)}"
        pid = self._pid.get(key)
        return f"{key} ready{took}" + ("" if pid is None else f" (pid {pid})")

    def _stop(self, key: str, p: Mapping[str, Any]) -> str:
        reason, decision = p.get("reason"), mapping_of(p.get("decision"))
        if made_room(reason, decision):
            return _evicted(key, decision)
        if reason == "shutdown":
            return f"stopping {key} (shutdown: {decision.get('cause', 'asked')})"
        return f"stopping {key} — {stop_why(reason, decision)}"

    def _stopped(self, key: str, p: Mapping[str, Any]) -> StoryLine:
        self._pid.pop(key, None)
        how = exit_how(_int_or_none(p.get("exit_code")), _int_or_none(p.get("signal")))
        return StoryLine(DETAIL, f"{key} stopped ({how})")

    def _stop_failed(self, key: str, p: Mapping[str, Any]) -> StoryLine:
        return _trouble(
            f"{key} would not stop — alive after TERM, TERM and KILL (pid {p.get('pid')}): "
            f"{p.get('detail')}"
        )

    def _crashed(self, key: str, p: Mapping[str, Any]) -> StoryLine:
        self._asked.pop(key, None)
        self._pid.pop(key, None)
        how = crash_how(
            _int_or_none(p.get("exit_code")),
            _int_or_none(p.get("signal")),
            _str_or_none(p.get("panic_kind")),
            _str_or_none(p.get("panic_line")),
            _number_or_none(p.get("uptime")),
            reached_ready=bool(p.get("reached_ready")),
        )
        retry = _number(p.get("retry_at")) - _number(p.get("at"))
        return _trouble(f"{key} crashed — {how}; may start again in {secs(max(retry, 0.0))}")

    def _adopted(self, key: str, p: Mapping[str, Any]) -> str:
        if isinstance(p.get("pid"), int):
            self._pid[key] = p["pid"]
        return f"took over {key} (pid {p.get('pid')}): still running, its caches warm"

    # -- requests, the ledger, the daemon -------------------------------------------------------

    def _enqueued(self, _stream: str, p: Mapping[str, Any]) -> StoryLine:
        engine = str(p.get("engine"))
        self._arrived[engine] = (p.get("id"), p.get("session_id"))
        self._refused.discard(engine)
        return StoryLine(DETAIL, f"request {p.get('id')} queued for {engine} ({p.get('lane')})")

    def _denied(self, _stream: str, p: Mapping[str, Any]) -> StoryLine | None:
        if self._owner is not None and p.get("owner") != self._owner:
            return StoryLine(DETAIL, f"another daemon's {p.get('key')} was refused by the ledger")
        limit = p.get("ceiling") if isinstance(p.get("ceiling"), int) else p.get("budget")
        return self._refusal(
            str(p.get("key")),
            f"refused {p.get('key')} — needs {size(p.get('bytes'))}, {size(p.get('shortfall'))} "
            f"short: {size(p.get('committed_other'))} held by other engines, budget "
            f"{size(limit)}",
        )

    def _room(self, _stream: str, p: Mapping[str, Any]) -> StoryLine:
        if p.get("reachable", True):
            evict = ", ".join(str(k) for k in p.get("evict") or []) or "nothing"
            return StoryLine(
                DETAIL,
                f"room for {p.get('for_key')}: {size(p.get('shortfall'))} short; evicting {evict}",
            )
        return self._refusal(
            str(p.get("for_key")),
            f"refused {p.get('for_key')} — needs {size(p.get('wanted'))}, "
            f"{size(p.get('shortfall'))} short, more than evicting every idle engine would free",
        )

    def _refusal(self, key: str, text: str) -> StoryLine:
        """A refusal for want of room: trouble the first time since the key's last request."""
        if key in self._refused:
            return StoryLine(DETAIL, text)
        self._refused.add(key)
        return _trouble(text)

    def _budget_set(self, _stream: str, p: Mapping[str, Any]) -> str | StoryLine:
        budget = p.get("budget")
        told = (True, budget)
        if self._budget == told:
            return StoryLine(DETAIL, f"budget set again to {size(budget)}: unchanged")
        self._budget = told
        if budget is None:
            return "budget set back to automatic (from the machine's memory)"
        return f"budget set to {size(budget)}"

    def _daemon_started(self, _stream: str, p: Mapping[str, Any]) -> str | StoryLine:
        if self._owner is None and isinstance(p.get("ledger_owner"), str):
            self._owner = p["ledger_owner"]
        said = []
        for what, items in (("took over", p.get("adopted")), ("lost", p.get("lost"))):
            if isinstance(items, list) and items:
                said.append(f"{what} {', '.join(str(i) for i in items)}")
        reaped = p.get("reaped")
        if isinstance(reaped, list) and reaped:
            said.append(f"stopped {len(reaped)} stray engine process(es)")
        text = f"daemon started (pid {p.get('pid')}, hostler {p.get('version')})"
        return f"{text}: {'; '.join(said)}" if said else StoryLine(DETAIL, text)


def _evicted(key: str, decision: Mapping[str, Any]) -> str:
    """PP4: ``key`` was evicted for another engine: who needed the room, and why ``key`` went."""
    wanted = decision.get("for")
    why = f"{wanted} needed {size(decision.get('shortfall'))} more than was free"
    candidate = candidates_of(decision).get(key)
    if candidate is not None:
        others = len(candidates_of(decision)) - 1
        among = f"the least wanted of {others + 1} idle engines" if others else "the only one idle"
        why += f"; {key} was {among} ({decision.get('eviction')}: {figures_of(candidate)})"
    drain = decision.get("drain")
    if isinstance(drain, Mapping) and drain.get("busy"):
        why += f", drained for {secs(drain.get('waited'))}"
    return f"evicted {key} for {wanted} — {why}"


def _drain_ended(_stream: str, p: Mapping[str, Any]) -> StoryLine | str:
    key, outcome = p.get("key"), p.get("outcome")
    if outcome == "busy":
        return _trouble(
            f"{key} still busy after draining {secs(p.get('waited'))}: it stays, and the "
            "start that needed its room is refused (engine-busy)"
        )
    if outcome == "abandoned":
        return f"{key} stays: nobody waits any more for the room it was draining for"
    return StoryLine(DETAIL, f"drain of {key} ended: {outcome}")


def _cancelled(_stream: str, p: Mapping[str, Any]) -> StoryLine | str:
    request, engine, waited = p.get("id"), p.get("engine"), secs(p.get("waited"))
    why = p.get("why")
    if why == "timeout":
        return _trouble(
            f"refused request {request} for {engine} — no slot within its queue timeout "
            f"(waited {waited})"
        )
    if why == "aborted":
        return f"request {request} for {engine} left the queue after {waited}: its client went"
    return f"request {request} for {engine} cancelled after {waited} in the queue ({why})"


def _spillover(_stream: str, p: Mapping[str, Any]) -> str:
    allowed = p.get("allowed")
    if allowed is None:
        said = "automatic"
    else:
        said = "allowed" if allowed is True else "forbidden" if allowed is False else str(allowed)
    return f"RAM spillover set to {said}"


def _degraded(_stream: str, p: Mapping[str, Any]) -> StoryLine:
    plan = mapping_of(p.get("plan"))
    return _trouble(
        f"{p.get('key')} ran out of GPU memory ({p.get('panic_kind')}): it starts again as "
        f"{plan.get('kind')}"
    )


def _cpu_unsupported(_stream: str, p: Mapping[str, Any]) -> StoryLine:
    """L22: what the engine build cannot run on this CPU, and what follows."""
    if p.get("what") == "quantized-kv":
        return _trouble(
            f"{p.get('key')} died of SIGILL with a {p.get('kv_type')} KV cache (this engine "
            "build needs CPU features this CPU lacks): it starts again with f16 KV, and so does "
            "every later start of this build here"
        )
    return _trouble(
        f"{p.get('key')} cannot run its model's weights on this CPU (SIGILL even with f16 KV): "
        f"{build_fix(str(p.get('key')))}"
    )


def _detail(kind: str, stream: str, payload: Mapping[str, Any]) -> StoryLine:
    text = json.dumps(payload, default=str, separators=(",", ":"))
    if len(text) > _DETAIL_CHARS:
        text = text[: _DETAIL_CHARS - 1] + "…"
    return StoryLine(DETAIL, f"{kind} {stream} {text}")


def _trouble(text: str) -> StoryLine:
    return StoryLine(TROUBLE, text)


def _subject(stream: str) -> str:
    """An engine stream's key (``engine/llamacpp:a:0`` → ``llamacpp:a:0``); else the stream."""
    return stream.removeprefix("engine/")


def _span(p: Mapping[str, Any]) -> str:
    return secs(_number(p.get("until")) - _number(p.get("since")))


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _number_or_none(value: object) -> float | None:
    return (
        _number(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None
