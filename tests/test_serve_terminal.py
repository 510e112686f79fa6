"""What ``hostler serve`` says on its terminal (issue 21): the story of its decisions, no noise.

A real ``hostler serve`` (the CLI, a real process) with two tiny real models under a budget
with room for one: two requests make it swap. Its terminal (stderr) holds exactly the story
lines — loading, ready, evicted for — derived from the recorded events; a client of
``/api/events`` that leaves adds nothing (asyncio's ``socket.send() raised exception.`` was
logged once per event written after it left); a stopped engine is not polled for its slots
(``GET /slots failed`` every 5 s); ``-q`` prints none of the story, ``-v`` adds the detail.
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from _rigs import room_for
from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import count, first_launch_costs, kill_leftovers, start_daemon, wait_for
from _support import run_cli

A, B = "llamacpp:alpha:0", "llamacpp:beta:0"
#: The time stamp each terminal line starts with.
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.MULTILINE)


def _config(folder: Path, names: tuple[str, ...], *, autostart: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        write_tiny_llama(folder / f"{name}.gguf")
    config = folder / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        + "".join(
            f'\n[[engines]]\nkey = "llamacpp:{n}:0"\nmodel = "{n}.gguf"\nctx = 512\n'
            f"autostart = {'true' if autostart else 'false'}\n"
            for n in names
        )
    )
    return config


@pytest.fixture(scope="module")
def budget(tmp_path_factory: pytest.TempPathFactory) -> int:
    """A budget with room for one tiny engine here (whole MiB), from a daemon of its own."""
    probe = tmp_path_factory.mktemp("probe")
    costs = first_launch_costs(
        _config(probe, ("alpha",), autostart=True), probe / "data", probe / "ledger.db", A
    )
    return room_for(1, *costs) // 2**20 * 2**20


@dataclass(frozen=True)
class _Serve:
    base: str
    data: Path
    log: Path

    def ask(self, model: str, session: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = httpx.post(
            f"{self.base}/v1/chat/completions",
            json=body,
            headers={"X-Hostler-Session": session},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text

    def said(self) -> str:
        return self.log.read_text()

    def wait_said(self, pattern: str, times: int = 1) -> None:
        wait_for(lambda: len(re.findall(pattern, self.said(), re.MULTILINE)) >= times, 60)


@contextlib.contextmanager
def _serving(tmp_path: Path, budget: int, *flags: str) -> Iterator[_Serve]:
    """``hostler serve FLAGS`` under ``budget``; SIGTERM at the end, which must exit 0."""
    config = _config(tmp_path, ("alpha", "beta"))
    data, log = tmp_path / "data", tmp_path / "serve.log"
    env = {"HOSTLER_CAPACITY_BUDGET_GB": repr(budget / 2**30)}
    server = start_daemon(
        config, data, log, command="serve", extra=("--port", "0", *flags), env=env
    )
    address = data / "address"
    try:
        wait_for(address.exists, 60)  # where it listens, said even under -q
        yield _Serve(address.read_text().strip(), data, log)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        kill_leftovers(data)


def _lines(text: str) -> list[str]:
    return [line for line in STAMP.sub("", text).splitlines() if line]


EVICTED = (
    r"evicted {victim} for {wanted} — {wanted} needed [\d.]+ [KM]iB more than was free; "
    r"{victim} was the only one idle \(demand-lru: 1 request in the last 60 s, idle [\d.]+ "
    r"m?s, [\d.]+ MiB\)"
)


@pytest.mark.slow
def test_the_terminal_tells_a_swap_and_nothing_else(tmp_path: Path, budget: int) -> None:
    with _serving(tmp_path, budget) as serve:
        serve.ask("alpha", "ana")
        serve.ask("beta", "bo")  # evicts alpha
        serve.wait_said(rf"^.*{B} ready")
        # a client of the event stream that reads one event and leaves (as the user did)
        left = run_cli("events", "--url", serve.base, "--limit", "1", "--json")
        assert left.returncode == 0, left.stderr
        serve.ask("alpha", "ana")  # evicts beta: events the stream's writer would have sent
        serve.wait_said(rf"^.*{A} ready", times=2)
    lines = _lines(serve.said())
    expected = [
        r"hostler: serving on http://127\.0\.0\.1:\d+ \(2 models; the token is in .*\)",
        rf"loading {A} for request \d+ \(session ana\)",
        rf"{A} ready in [\d.]+ m?s \(pid \d+\)",
        EVICTED.format(victim=A, wanted=B),
        rf"loading {B} for request \d+ \(session bo\)",
        rf"{B} ready in [\d.]+ m?s \(pid \d+\)",
        EVICTED.format(victim=B, wanted=A),
        rf"loading {A} for request \d+ \(session ana\)",
        rf"{A} ready in [\d.]+ m?s \(pid \d+\)",
        rf"stopping {A} \(shutdown: SIGTERM\)",
        r"daemon stopped \(pid \d+\)",
    ]
    assert len(lines) == len(expected), "\n".join(lines)
    for line, pattern in zip(lines, expected, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)


@pytest.mark.slow
def test_verbose_adds_the_detail_but_never_polls_a_stopped_engine(
    tmp_path: Path, budget: int
) -> None:
    with _serving(tmp_path, budget, "-v") as serve:
        serve.ask("alpha", "ana")  # its prompt cache is polled every 5 s while it runs
        serve.ask("beta", "bo")  # evicts alpha
        serve.wait_said(rf"^.*evicted {A} for {B}")
        after = len(serve.said())
        # a stretch after the eviction: the prompt-cache controller polled twice more, alpha not
        reconciled = rf"prompt caches reconciled: asked {B}$"
        wait_for(lambda: len(re.findall(reconciled, serve.said()[after:], re.MULTILINE)) >= 2, 30)
        stretch = serve.said()[after:]
    said = serve.said()
    assert f"{A} spawned: pid " in said  # the detail
    assert re.search(r"queue\.dispatched queue/llamacpp:alpha:0 \{", said)
    assert "/slots" not in stretch, stretch
    assert "socket.send()" not in said
    assert "Traceback" not in said


@pytest.mark.slow
def test_quiet_prints_none_of_the_story(tmp_path: Path, budget: int) -> None:
    with _serving(tmp_path, budget, "-q") as serve:
        serve.ask("alpha", "ana")
        serve.ask("beta", "bo")  # evicts alpha
        assert count(serve.data, A, "engine.stopped") == 1
        run_cli("events", "--url", serve.base, "--limit", "1")
    assert serve.said() == ""
