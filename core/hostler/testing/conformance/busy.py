"""The adapter conformance suite's checks of a busy engine: what hostler sends beside a request.

hostler does not wait for an engine to be idle before it asks it something else. Its health
check (``GET readiness_path``, every ``health_interval``) goes out while completions run, and
answers later than :data:`~hostler.engines.watcher.HEALTH_WAIT` count as failures (three in a
row restart the engine, cutting what it runs). Its request gate lets ``spec.slots`` requests
run at once, so a second request may arrive while a first one streams. Each check streams a
long completion (``stream_body``) and, once its first chunk has come, asks the engine the other
thing; the stream must still be running when the answer comes, or the check cannot tell.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import anyio

from hostler.engines.http import probe_status
from hostler.engines.price import slot_limit_of
from hostler.engines.watcher import HEALTH_WAIT
from hostler.plugin import EngineAdapter
from hostler.testing.conformance.live import Live, http_json
from hostler.testing.conformance.settings import ConformanceSettings

__all__ = ["BusyChecks", "Stream"]

#: Seconds a stream's first chunk may take (the engine is ready: a prompt, one token).
FIRST_CHUNK_WAIT = 60.0


class Stream:
    """A streamed completion, read to its end on a thread of its own.

    Args:
        port: The engine's port.
        path: The completion path.
        body: The request body (it asks ``"stream": true``).
    """

    def __init__(self, port: int, path: str, body: dict[str, Any]) -> None:
        self.events: list[bytes] = []
        self.error = ""
        self.ended_at: float | None = None
        self._first = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(port, path, body), daemon=True)
        self._thread.start()

    def _read(self, port: int, path: str, body: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/json"}
        data = json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:  # noqa: S310 - loopback
                for line in reply:
                    if line.startswith(b"data:"):
                        self.events.append(line[5:].strip())
                        self._first.set()
        except urllib.error.HTTPError as exc:
            self.error = f"{path} answered {exc.code}: {exc.read()[:300]!r}"
        except OSError as exc:
            self.error = f"{path} failed: {exc}"
        finally:
            self.ended_at = time.monotonic()
            self._first.set()
            self._done.set()

    async def started(self) -> None:
        """Wait for its first chunk (or its end); a stream that never began fails here."""
        await anyio.to_thread.run_sync(self._first.wait, FIRST_CHUNK_WAIT)
        assert not self.error, self.error
        assert self.events, f"no chunk within {FIRST_CHUNK_WAIT:g} s"

    async def ended(self) -> None:
        """Wait for its end."""
        await anyio.to_thread.run_sync(self._done.wait, 150.0)
        assert self.ended_at is not None, "the stream never ended"

    def running_at(self, moment: float) -> bool:
        """Whether the stream was still running at ``moment`` (monotonic)."""
        return self.ended_at is None or self.ended_at > moment

    def whole(self) -> str:
        """Why the stream was cut short, or ``""`` when it ended as a stream ends.

        Whole: no error, a chunk with a ``finish_reason`` (why the engine stopped), and
        ``data: [DONE]`` last.
        """
        if self.error:
            return self.error
        if not self.events or self.events[-1] != b"[DONE]":
            last = self.events[-1][:200] if self.events else b""
            return f"it ended without data: [DONE] (last event {last!r})"
        if not any(_finish_reason(event) for event in self.events[:-1]):
            return "it ended without a finish_reason: the engine stopped it early"
        return ""


def _finish_reason(event: bytes) -> object:
    try:
        chunk = json.loads(event)
    except ValueError:
        return None
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list):
        return None
    return next((c.get("finish_reason") for c in choices if isinstance(c, dict)), None)


class BusyChecks(ConformanceSettings):
    """The ``test_live_*`` checks of an engine that is serving a completion."""

    def streamed(self, adapter: EngineAdapter) -> dict[str, Any]:
        """The long completion the checks stream (``stream_body``, with ``request_model``)."""
        body = dict(self.stream_body)
        if adapter.request_model is not None:  # RD10: as hostler serve forwards it
            body["model"] = adapter.request_model
        return body

    def test_live_health_answers_while_a_completion_runs(self, live: Live) -> None:
        """SP3: the health path answers within the health check's wait while a completion runs.

        hostler sends its health check whether or not a request is running; an answer that
        waits for the completion to end is a failed check, and three in a row restart the
        engine, cutting the completion. An engine that serves no completions passes as it is.
        """
        if self.serves_completions:
            anyio.run(self._health_while_busy, live)

    async def _health_while_busy(self, live: Live) -> None:
        sup = live.supervisor()
        port = await sup.ensure_running()
        stream = Stream(port, self.completion_path, self.streamed(live.adapter))
        await stream.started()
        asked = time.monotonic()
        status = await probe_status(port, live.adapter.readiness_path, wait=HEALTH_WAIT)
        answered = time.monotonic()
        await stream.ended()
        await sup.stop()
        path = live.adapter.readiness_path
        assert stream.running_at(asked), (
            "the completion had ended before the check could ask anything: "
            "give stream_body a longer completion"
        )
        assert status is not None, (
            f"GET {path} did not answer within {HEALTH_WAIT:g} s while a completion ran: "
            "a failed health check (3 in a row restart the engine mid-request)"
        )
        assert live.adapter.is_ready(status), f"GET {path} answered {status} while busy"
        assert stream.running_at(answered), (
            f"GET {path} answered only once the running completion had ended "
            f"({answered - asked:.2f} s): the health path waits behind completions, and a "
            f"completion longer than {HEALTH_WAIT:g} s fails the health check"
        )

    @staticmethod
    def _width(adapter: EngineAdapter, model: Path) -> int:
        limit = slot_limit_of(adapter, adapter.read_geometry(model))
        return 2 if limit is None else min(2, limit)

    def test_live_a_second_request_leaves_a_running_stream_whole(
        self, adapter: EngineAdapter, model: Path, launch_options: dict[str, object], tmp_path: Path
    ) -> None:
        """Two requests at once within the engine's slots: the first stream ends uncut.

        Launched with two slots, the engine is streamed a long completion; once its first
        chunk has come, a second completion is sent, and must be answered; the stream must
        then end as a stream ends (a ``finish_reason``, then ``data: [DONE]``). A serial
        engine (a slot limit of 1) is never sent two requests at once: it passes as it is,
        as does an engine that serves no completions.
        """
        width = self._width(adapter, model)
        if width < 2 or not self.serves_completions:
            return
        rig = Live(self, adapter, model, launch_options, tmp_path, slots=width)
        try:
            anyio.run(self._second_request, rig)
        finally:
            rig.close()

    async def _second_request(self, live: Live) -> None:
        sup = live.supervisor()
        port = await sup.ensure_running()
        stream = Stream(port, self.completion_path, self.streamed(live.adapter))
        await stream.started()
        sent = time.monotonic()
        asked = dict(self.completion_body)
        if live.adapter.request_model is not None:
            asked["model"] = live.adapter.request_model
        status, body = await anyio.to_thread.run_sync(http_json, port, self.completion_path, asked)
        await stream.ended()
        await sup.stop()
        assert stream.running_at(sent), (
            "the first completion had ended before the second was sent: "
            "give stream_body a longer completion"
        )
        assert status == 200, f"the second request: {self.completion_path} answered {status}"
        assert json.loads(body).get("choices"), body[:300]
        cut = stream.whole()
        assert not cut, f"a second request cut the running stream: {cut}"
