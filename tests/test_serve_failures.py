"""A crash, and a shutdown, under a request, as the official ``openai`` client meets them.

The real ``hostler serve`` (a child process) with the real ``llama-server`` on SmolLM2-135M
(F16: slow enough on a CPU that a 300-token answer is still streaming when it is cut), one slot
so that a second request queues behind the first.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from hostler.testing.smollm2 import smollm2_gguf

from _daemons import ServeChild

pytestmark = pytest.mark.slow

HI: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smollm2_gguf(tmp_path_factory.mktemp("smollm2"))


class Served(ServeChild):
    def __init__(self, folder: Path, model: Path) -> None:
        super().__init__(
            folder, f'[[models]]\nid = "alpha"\npath = "{model}"\nctx = 1024\nslots = 1\n'
        )
        self.client = openai.OpenAI(
            base_url=f"{self.base}/v1", api_key="x", max_retries=0, timeout=120
        )

    def engine_pid(self) -> int:
        engines = self.get("/api/engines")["engines"]
        return int(next(e["pid"] for e in engines if e["key"] == "llamacpp:alpha:0"))

    def queued(self) -> int:
        queues = self.get("/api/queues")
        return int(queues.get("llamacpp:alpha:0", {}).get("queued_interactive", 0))


@pytest.fixture
def served(tmp_path: Path, smollm2: Path) -> Iterator[Served]:
    it = Served(tmp_path, smollm2)
    try:
        yield it
    finally:
        it.close()


def ask_in_background(served: Served, into: dict[str, object]) -> threading.Thread:
    def ask() -> None:
        try:
            answer = served.client.chat.completions.create(model="alpha", messages=HI, max_tokens=4)
            into["answer"] = answer.choices[0].finish_reason
        except openai.APIStatusError as exc:
            into["status"], into["body"] = exc.status_code, exc.body

    thread = threading.Thread(target=ask)
    thread.start()
    return thread


def wait_until_queued(served: Served) -> None:
    deadline = time.monotonic() + 30
    while served.queued() < 1:  # polled over HTTP: the queue is the daemon's to tell
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.02)


def streaming_with_one_queued(
    served: Served, into: dict[str, object]
) -> tuple[Iterator[ChatCompletionChunk], threading.Thread]:
    """A 300-token stream, three chunks in, and a request queued behind it (answer: ``into``)."""
    stream = served.client.chat.completions.create(
        model="alpha", messages=HI, max_tokens=300, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = iter(stream)
    for _ in range(3):
        assert next(chunks).model == "alpha"
    behind = ask_in_background(served, into)
    wait_until_queued(served)
    return chunks, behind


def test_a_crash_mid_stream_ends_it_with_an_error_and_the_request_behind_waits_for_the_restart(
    served: Served,
) -> None:
    into: dict[str, object] = {}
    chunks, behind = streaming_with_one_queued(served, into)
    os.kill(served.engine_pid(), signal.SIGKILL)
    with pytest.raises(openai.APIError) as cut:
        list(chunks)
    assert cut.value.code == "engine-crashed"
    assert "stopped answering mid-answer" in cut.value.message
    behind.join(timeout=120)
    assert into == {"answer": "length"}  # served by the restarted engine, never a 502
    assert "Traceback" not in served.log.read_text()


def test_a_shutdown_answers_in_flight_and_queued_requests_503_shutting_down(
    served: Served,
) -> None:
    into: dict[str, object] = {}
    chunks, behind = streaming_with_one_queued(served, into)
    served.daemon.send_signal(signal.SIGINT)  # Ctrl-C
    with pytest.raises(openai.APIError) as cut:
        list(chunks)
    assert cut.value.code == "shutting-down"
    behind.join(timeout=120)
    assert into["status"] == 503
    body = into["body"]
    assert isinstance(body, dict) and body["code"] == "shutting-down"
    # found by a breaking helper: it said "the runtime is closed (or was never entered...)"
    assert (
        body["message"]
        == "hostler is shutting down: 'alpha' is not served; ask again once it is back"
    )
    assert served.daemon.wait(timeout=60) in (0, 130)
    log = served.log.read_text()
    assert "Traceback" not in log and "CancelledError" not in log
