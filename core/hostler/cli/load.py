"""``hostler load`` (with the steps shown as they happen) and ``hostler unload``.

While ``POST /api/models/{model}/load`` runs, the daemon's event stream is tailed from the seq
it had just before, and each step for that model is printed as it is recorded: the room
planned, each engine evicted for it, the start, the spawned pid, ready (or denied, failed).
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from hostler.cli.client import (
    call,
    checks_answers,
    daemon_url,
    event_stream,
    fetch,
    token_of,
)
from hostler.cli.tables import size
from hostler.errors import HostlerError, UsageError

__all__ = ["model_of", "run_load", "run_unload", "step_line"]

#: After the load answered, how long the event tail may take to deliver its last steps.
CATCH_UP = 2.0
#: How long the tail waits for an event before it checks whether it should stop.
TAIL_IDLE = 0.5


def model_of(key: str) -> str:
    """The model part of an engine key (``llamacpp:alpha:0`` → ``alpha``)."""
    parts = key.split(":")
    return parts[1] if len(parts) >= 2 else key


def _room(payload: Mapping[str, Any]) -> str:
    evict = ", ".join(payload.get("evict") or []) or "nothing"
    line = (
        f"room planned for {payload.get('for_key')}: {size(payload.get('wanted'))} needed, "
        f"{size(payload.get('shortfall'))} short; evicting {evict}"
    )
    if payload.get("drain"):
        line += f", draining {payload['drain']}"
    return line if payload.get("reachable", True) else line + " (not enough can be freed)"


_ENGINE_STEPS: dict[str, Callable[[str, Mapping[str, Any]], str]] = {
    "engine.start_requested": lambda key, p: f"starting {key} ({p.get('cause')})",
    "engine.spawned": lambda key, p: f"spawned {key}: pid {p.get('pid')}, port {p.get('port')}",
    "engine.ready": lambda key, _p: f"ready {key}",
    "engine.failed": lambda key, p: f"failed {key}: {p.get('error')}",
    "engine.crashed": lambda key, p: f"crashed {key} ({_crash_how(p)})",
}


def _crash_how(payload: Mapping[str, Any]) -> str:
    """How the engine ended, as the daemon's story says it (exit status or signal)."""
    from hostler.postmortem.explain_wording import crash_how  # noqa: PLC0415 - on a crash only

    def whole(name: str) -> int | None:
        value = payload.get(name)
        return value if type(value) is int else None

    ready = bool(payload.get("reached_ready"))
    return crash_how(whole("exit_code"), whole("signal"), None, None, None, reached_ready=ready)


def step_line(event: Mapping[str, Any], model: str) -> str | None:
    """One progress line for a daemon event that concerns loading ``model`` (else None)."""
    kind, payload = str(event.get("type")), event.get("payload") or {}
    stream = str(event.get("stream", ""))
    if kind == "pool.room_planned":
        return _room(payload) if model_of(str(payload.get("for_key"))) == model else None
    if not stream.startswith("engine/"):
        return None
    key = stream[len("engine/") :]
    if kind == "engine.stop_requested":
        decision = payload.get("decision")
        wanted = decision.get("for") if isinstance(decision, Mapping) else None
        if payload.get("reason") == "evicted" and wanted and model_of(str(wanted)) == model:
            return f"evicting {key} (for {wanted})"
        return None
    step = _ENGINE_STEPS.get(kind)
    return step(key, payload) if step is not None and model_of(key) == model else None


class _Tail:
    """The daemon's events after a seq, read on a thread into a queue until :meth:`stop`."""

    def __init__(self, url: str, after: int, token: str | None) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen = after  # the last seq taken from the queue
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(url, after, token), daemon=True)
        self._thread.start()

    def _read(self, url: str, after: int, token: str | None) -> None:
        try:
            while not self._stopped.is_set():  # reconnects after each quiet TAIL_IDLE
                for event in event_stream(url, after, token, idle=TAIL_IDLE):
                    after = int(event.get("seq") or after)
                    self.events.put(event)
        except HostlerError:
            return  # progress is a nicety: the load's own answer says what happened

    def stop(self) -> None:
        """Stop reading (within :data:`TAIL_IDLE` seconds)."""
        self._stopped.set()
        self._thread.join(TAIL_IDLE * 2)


def _load(url: str, model: str, token: str | None, answer: dict[str, Any]) -> None:
    try:
        answer["ok"] = call(
            "POST", url, f"/api/models/{quote(model, safe='')}/load", token, timeout=600
        )
    except HostlerError as exc:
        answer["error"] = exc


@checks_answers
def run_load(args: argparse.Namespace) -> int:
    """Load a model now (making room as a request would), printing each step as it happens."""
    url, token = daemon_url(args), token_of(args)
    assert url is not None  # noqa: S101 - a default is given
    before = fetch(url, "/api/engines", token)
    started = time.monotonic()
    answer: dict[str, Any] = {}
    if args.json:
        _load(url, args.model, token, answer)
    else:
        _with_progress(url, args.model, token, answer, before)
    if "error" in answer:
        raise answer["error"]
    result = answer["ok"]
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    took = time.monotonic() - started
    print(f"{result['model']}: loaded as {result['key']} in {took:.1f} s")
    return 0


def _with_progress(
    url: str, model: str, token: str | None, answer: dict[str, Any], before: Mapping[str, Any]
) -> None:
    tail = _Tail(url, int(before.get("last_seq") or 0), token)
    loader = threading.Thread(target=_load, args=(url, model, token, answer), daemon=True)
    started = time.monotonic()
    if sys.stdout.isatty():  # a terminal sees at once that it began; a pipe gets the steps
        print(f"loading {model}…", flush=True)

    def say(line: str) -> None:
        print(f"{time.monotonic() - started:6.1f}s  {line}", flush=True)

    loader.start()
    _show(tail, model, say, lambda _seq: loader.is_alive())
    # the answer came: its steps are in the log already; let the tail deliver them
    try:
        last = int(fetch(url, "/api/engines", token).get("last_seq") or 0)
    except HostlerError:
        last = 0
    deadline = time.monotonic() + CATCH_UP
    _show(tail, model, say, lambda seq: seq < last and time.monotonic() < deadline)
    tail.stop()


def _show(
    tail: _Tail, model: str, say: Callable[[str], None], keep_going: Callable[[int], bool]
) -> None:
    """Print the steps the tail delivers while ``keep_going(last seq seen)``."""
    while keep_going(tail.seen):
        try:
            event = tail.events.get(timeout=0.1)
        except queue.Empty:
            continue
        tail.seen = int(event.get("seq") or tail.seen)
        line = step_line(event, model)
        if line is not None:
            say(line)


@checks_answers
def run_unload(args: argparse.Namespace) -> int:
    """Unload an engine now, or every resident engine of a model (its replicas).

    A name with ``:`` is an engine key; else a model id, whose resident engines are unloaded
    one by one (an idle one goes; a busy one is refused, said in one line).
    """
    url, token = daemon_url(args), token_of(args)
    assert url is not None  # noqa: S101 - a default is given
    keys = [args.key] if ":" in args.key else _engines_of(url, args.key, token)
    answers = [
        call("POST", url, f"/api/engines/{quote(key, safe=':')}/unload", token) for key in keys
    ]
    if args.json:
        print(json.dumps(answers[0] if ":" in args.key else answers, indent=2))
    elif not answers:
        print(f"{args.key}: was not loaded")
    for answer in [] if args.json else answers:
        print(f"{answer['key']}: {'unloaded' if answer['unloaded'] else 'was not loaded'}")
    return 0


def _engines_of(url: str, model: str, token: str | None) -> list[str]:
    """The resident engines of ``model`` (none when it is offered but not loaded).

    A model no longer offered (its file gone, MD6) whose engine still runs is found by that
    engine: the unload is how it leaves.

    Raises:
        UsageError: The daemon neither offers a model of that id nor runs one (the models it
            offers named).
    """
    offered = sorted({str(m["id"]) for m in fetch(url, "/v1/models", token).get("data") or []})
    engines = fetch(url, "/api/engines", token).get("engines") or []
    resident = sorted(
        str(e["key"])
        for e in engines
        if model_of(str(e["key"])) == model and e.get("state") in RESIDENT
    )
    if model not in offered and not resident:
        shown = ", ".join(offered[:_NAMED]) + (
            f" and {len(offered) - _NAMED} more" if len(offered) > _NAMED else ""
        )
        raise UsageError(
            f"unload: {model[:100]!r} is neither a model id nor an engine key (models: "
            f"{shown or 'none'}; `hostler ps` lists the keys)"
        )
    return resident


#: The most model ids a refusal names.
_NAMED = 10
#: The engine states an unload acts on (a stopped engine has nothing to unload).
RESIDENT = frozenset({"running"})
