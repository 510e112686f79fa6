"""The readiness wait and the hooks the supervisor asks, against real engine processes.

RD1: a probe in flight is bounded by the start's deadline and cancelled by a stop; a probe HTTP
cannot carry fails where it is made. SG3: every hook's answer is type-checked where it is
asked (``Supervisor._ask``). SG7: a death hostler did not cause is a crash even when a stop
comes before the watch saw it.
"""

from __future__ import annotations

import gc
import inspect
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import anyio
import pytest

import test_contract as contract
from hostler import EventStore
from hostler.capacity.budget import HostMemory, compute_budget
from hostler.drivers.host_ledger import HostLedger, OwnerIdentity
from hostler.engines.http import probe_response
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineStartError, PluginError
from hostler.events.calibration import CALIBRATION_STREAM
from hostler.plugin import (
    EngineAdapter,
    LaunchCommand,
    LaunchSpec,
    ReadinessProbe,
    json_fields_match,
)
from hostler.pluginhost import answer_problem
from hostler.testing.fake_engine import FakeEngineAdapter

GIB = 2**30


def write_model(tmp_path: Path) -> Path:
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")
    return model


# --- RD1: what a probe may hold ----------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/h\u00e9alth", "/health now", "/health\r\nX: y", "/health\n", "/a\tb", "/\x7f", "/\x00"],
)
def test_a_probe_path_http_cannot_carry_is_refused_where_it_is_made(path: str) -> None:
    with pytest.raises(ValueError, match=r"visible ASCII"):
        ReadinessProbe(path=path)
    with pytest.raises(ValueError, match=r"visible ASCII"):

        class Bad(FakeEngineAdapter):  # the class attribute, when the class is made
            readiness_path = path


def test_a_probe_path_of_visible_ascii_is_taken_as_it_is() -> None:
    path = "/v1/models?x=%20&y=~!*'()"
    assert ReadinessProbe(path=path).path == path
    assert ReadinessProbe(path="/").path == "/"


@pytest.mark.parametrize("method", ["DELETE", "get", "Post", "", "GET ", None, b"GET"])
def test_a_probe_method_other_than_get_or_post_is_refused(method: object) -> None:
    with pytest.raises(ValueError, match=r"method .* must be 'GET' or 'POST'"):
        ReadinessProbe(method=method)  # type: ignore[arg-type]


def test_a_probe_body_that_is_not_bytes_and_a_content_type_with_a_newline_are_refused() -> None:
    with pytest.raises(ValueError, match=r"body must be bytes or None, not str"):
        ReadinessProbe(method="POST", body="{}")  # type: ignore[arg-type]
    for content_type in ("application/json\r\nX: y", "", "t\u00e9xt/plain"):
        with pytest.raises(ValueError, match=r"content_type"):
            ReadinessProbe(method="POST", body=b"{}", content_type=content_type)
    probe = ReadinessProbe(method="POST", body=b"{}", content_type="application/json; q=1")
    assert (probe.method, probe.content_type) == ("POST", "application/json; q=1")


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("expect_json", "ready", "expect_json must map field names to values"),
        ("expect_json", ["status"], "expect_json must map field names to values"),
        ("expect_json", {"": 1}, "expect_json must map field names to values"),
        ("expect_json", {1: "ok"}, "expect_json must map field names to values"),
        ("wait", True, "wait must be over 0 and at most 600 seconds, not True"),
        ("wait", "1", "wait must be over 0 and at most 600 seconds, not '1'"),
        ("wait", 0, "wait must be over 0"),
        ("wait", 600.0001, "wait must be over 0"),
        ("wait", float("nan"), "wait must be over 0"),
        ("ready_line", b"ready", "ready_line must be a str"),
    ],
)
def test_a_probes_fields_are_checked_where_it_is_made(field: str, value: object, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        ReadinessProbe(**{field: value})  # type: ignore[arg-type]


def test_a_probes_fields_at_their_edges_are_taken() -> None:
    assert ReadinessProbe(wait=600).wait == 600
    assert ReadinessProbe(wait=0.001).wait == 0.001
    assert ReadinessProbe(expect_json={"status": "ok", "a.b": 1}).expect_json == {
        "status": "ok",
        "a.b": 1,
    }
    assert ReadinessProbe(expect_json={}).expect_json == {}


def test_the_http_client_refuses_what_it_cannot_send_as_a_value_error() -> None:
    """Never a UnicodeEncodeError nor a CR/LF written into the request (checked before any I/O)."""

    async def main() -> None:
        for path, method in (("/h\u00e9alth", "GET"), ("/x\r\nX: y", "GET"), ("/", "PUT")):
            with pytest.raises(ValueError, match=r"readiness (path|method)") as caught:
                await probe_response(1, path, method=method)
            assert not isinstance(caught.value, UnicodeError)

    anyio.run(main)


def test_a_body_nested_too_deep_to_parse_does_not_match() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert json_fields_match(deep, {"status": "ok"}) is False
    nested = b'{"status": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert json_fields_match(nested, {"status": "ok"}) is False
    assert json_fields_match(b'{"status": "ok"}', {"status": "ok"}) is True  # the control


# --- RD1: the deadline bounds a probe in flight; a stop cancels it ------------------------------


class SlowAnswer(FakeEngineAdapter):
    """Probed on /busy/1: every answer comes a second after it is asked."""

    engine_type = "slow-answer"

    def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
        return ReadinessProbe(path="/busy/1", wait=30)


def test_a_slow_probe_answered_before_the_deadline_still_makes_the_engine_ready(
    tmp_path: Path,
) -> None:
    """The deadline cuts only what would run past it: a 1 s answer within 20 s is ready."""

    async def main() -> float:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, SlowAnswer(), write_model(tmp_path), tmp_path / "work",
                startup_timeout=20.0,
            )  # fmt: skip
            began = time.monotonic()
            try:
                await sup.ensure_running()
                return time.monotonic() - began
            finally:
                await sup.stop()

    took = anyio.run(main)
    assert 1.0 <= took < 10.0, took


def test_a_stop_during_the_pause_between_probes_aborts_the_start_at_once(tmp_path: Path) -> None:
    """The poll's pause is cancelled as a probe is: a 30 s pause never delays a stop."""

    class NeverReady(contract.Scripted):
        def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
            return ReadinessProbe(path="/health", expect_json={"status": "never"})

    async def main() -> tuple[float, list[str]]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, NeverReady(tmp_path, load=0.0), write_model(tmp_path),
                tmp_path / "work", startup_timeout=120.0, readiness_poll=30.0,
            )  # fmt: skip
            failed: list[BaseException] = []

            async def start() -> None:
                try:
                    await sup.ensure_running()
                except BaseException as exc:  # what the start ended with
                    failed.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(start)
                await anyio.sleep(2.0)  # the engine answers "ok", not "never": it pauses 30 s
                began = time.monotonic()
                await sup.stop("user")
                took = time.monotonic() - began
            assert sup.pid is None
            assert "start aborted: stop requested (user)" in str(failed[0])
            types = [r.type for r in store.read_all() if r.stream_id == f"engine/{sup.key}"]
            return took, types

    took, types = anyio.run(main)
    assert took < 5.0, took
    assert types[-2:] == ["engine.stop_requested", "engine.stopped"], types


# --- SG7: a death hostler did not cause --------------------------------------------------------


def killed_then_stopped(tmp_path: Path, *, kill: bool) -> tuple[list[Any], str, int]:
    """Start a real engine with a ledger, SIGKILL it (or not), then stop it as an eviction.

    Returns the engine's events, the state after the stop, and the bytes the ledger still holds.
    """
    model = write_model(tmp_path)

    async def main() -> tuple[list[Any], str, int]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            ledger = HostLedger(
                store, OwnerIdentity.current("sg7"), lambda: compute_budget(HostMemory(64 * GIB))
            )
            key = "scripted:m:0"
            sup = Supervisor(
                key,
                contract.Scripted(tmp_path, load=0.0),
                lambda port: LaunchSpec(key, model, port, ctx_per_slot=256, work_dir=tmp_path),
                store,
                run_dir=tmp_path / "run",
                token_prefix="sg7",
                policy=SupervisorPolicy(watch_interval=30.0),
                ledger=ledger,
                footprint=lambda: 64 * 2**20,
            )
            await sup.ensure_running()
            assert ledger.refresh().committed > 0  # held (as measured once ready)
            pid = sup.pid
            assert pid is not None
            if kill:
                os.kill(pid, 9)
                await anyio.sleep(0.3)  # dead; no watch runs (watch() is never started)
            await sup.stop("evicted", {"rule": "GA1"})
            rows = [r for r in store.read_all() if r.stream_id == f"engine/{key}"]
            return rows, str(sup.state), ledger.refresh().committed

    return anyio.run(main)


def test_a_stop_after_an_unseen_death_records_the_crash_then_the_stop(tmp_path: Path) -> None:
    rows, state, held = killed_then_stopped(tmp_path, kill=True)
    types = [r.type for r in rows]
    assert types[-2:] == ["engine.crashed", "engine.stop_requested"], types
    assert "engine.stopped" not in types  # the corpse was never "stopped" by a signal of ours
    crash = rows[-2].payload
    assert (crash["signal"], crash["exit_code"], crash["reached_ready"]) == (9, None, True)
    assert rows[-1].payload["reason"] == "evicted"
    assert rows[-1].payload["decision"] == {"rule": "GA1"}
    assert state == "stopped"
    assert held == 0  # the eviction that asked still gets its room


def test_a_stop_of_a_live_engine_records_no_crash(tmp_path: Path) -> None:
    """The control: the check looks at the process, it does not guess."""
    rows, state, held = killed_then_stopped(tmp_path, kill=False)
    types = [r.type for r in rows]
    assert types[-2:] == ["engine.stop_requested", "engine.stopped"], types
    assert "engine.crashed" not in types
    assert (state, held) == ("stopped", 0)


# --- SG3: every hook's answer is checked where it is asked -------------------------------------


def junk_adapter(hook: str, answer: object) -> type[contract.Scripted]:
    """The scripted engine, its ``hook`` answering ``answer`` (called first when callable)."""

    def method(self: EngineAdapter, *args: object) -> object:
        return answer() if callable(answer) else answer

    return type(f"Junk_{hook}", (contract.Scripted,), {hook: method, "engine_type": "junk"})


async def _not_ready(*args: object) -> bool:
    return False


@pytest.mark.parametrize(
    ("hook", "answer"),
    [
        ("is_ready_response", "no"),
        ("is_ready_response", 1),
        ("is_ready_response", _not_ready),  # an accidental `async def`
        ("is_ready", "yes"),  # reached through the default is_ready_response
        ("classify_line", "fatal"),
        ("progress", 0.5),
        ("readiness", "/health"),
        ("build_identity", 42),
        ("validate_model", "model.bin"),  # a str, not a Path
        ("validate_model", Path("model.bin")),  # a Path, not an absolute one
        ("build_command", ["python"]),
    ],
)
def test_a_hook_that_answers_the_wrong_type_fails_the_start_naming_the_plugin(
    tmp_path: Path, hook: str, answer: object
) -> None:
    model = write_model(tmp_path)

    async def main() -> tuple[BaseException | None, int | None, list[str]]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            adapter = junk_adapter(hook, answer)(tmp_path, load=0.0)
            sup = contract.supervisor(store, adapter, model, tmp_path / "work", startup_timeout=5.0)
            raised: BaseException | None = None
            try:
                await sup.ensure_running()
            except BaseException as exc:  # what the start ended with
                raised = exc
            finally:
                await sup.stop()
            types = [r.type for r in store.read_all() if r.stream_id == f"engine/{sup.key}"]
            return raised, sup.pid, types

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a coroutine left "never awaited" fails the test
        raised, pid, types = anyio.run(main)
        gc.collect()
    where = "is_ready_response" if hook == "is_ready" else hook
    shown = "<coroutine object _not_ready" if callable(answer) else repr(answer)
    assert isinstance(raised, PluginError), repr(raised)
    assert f".Junk_{hook}) returned {shown}" in str(raised), str(raised)
    assert str(raised).endswith(f" from {where}"), str(raised)
    assert pid is None
    assert types[-1] == "engine.failed", types


def test_a_model_identity_of_the_wrong_type_costs_the_lesson_not_the_start(
    tmp_path: Path,
) -> None:
    """model_identity is asked through the same check; its fault is suppressed where asked."""
    model = write_model(tmp_path)
    adapter_class = junk_adapter("model_identity", 7)

    async def main() -> list[str]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            ledger = HostLedger(
                store, OwnerIdentity.current("sg3"), lambda: compute_budget(HostMemory(64 * GIB))
            )
            key = "junk:m:0"
            sup = Supervisor(
                key,
                adapter_class(tmp_path, load=0.0),
                lambda port: LaunchSpec(key, model, port, ctx_per_slot=256, work_dir=tmp_path),
                store,
                run_dir=tmp_path / "run",
                token_prefix="sg3",
                ledger=ledger,
                footprint=lambda: 64 * 2**20,
            )
            await contract.ready_then_stop(sup)
            return [r.payload["model"] for r in store.read_stream(CALIBRATION_STREAM)]

    assert anyio.run(main) == ["model.bin"]  # the model's file name, not the junk 7


# --- SG3: the one check, pure ------------------------------------------------------------------


def test_answer_problem_is_exact_for_verdicts_and_counts() -> None:
    assert answer_problem(True, bool) is None
    assert answer_problem(False, bool) is None
    assert answer_problem(1, bool) == "returned 1"
    assert answer_problem("no", bool) == "returned 'no'"
    assert answer_problem(None, bool) == "returned None"
    assert answer_problem(0, int) is None
    assert answer_problem(True, int) == "returned True"  # a bool is no count
    assert answer_problem(1.0, int) == "returned 1.0"
    assert answer_problem(None, Path, optional=True) is None
    assert answer_problem(Path("/m"), Path, optional=True) is None
    assert answer_problem("x" * 100, str) is None
    assert answer_problem("x" * 100, Path) == "returned " + repr("x" * 100)[:60]


def test_answer_problem_closes_a_coroutine_and_survives_a_broken_repr() -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    assert answer_problem(Broken(), bool) == "returned <Broken (its repr could not be read)>"
    coroutine = _not_ready()
    assert answer_problem(coroutine, bool, optional=True) is not None
    assert inspect.getcoroutinestate(coroutine) == "CORO_CLOSED"  # never left "never awaited"


def test_a_health_path_that_cannot_be_sent_fails_the_engine_naming_the_plugin(
    tmp_path: Path,
) -> None:
    """A readiness_path set on the instance (past the class check) is the plugin's error."""

    class Altered(contract.Scripted):
        def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
            return ReadinessProbe(path="/health")

    async def main() -> tuple[int | None, list[Any]]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            adapter = Altered(tmp_path, load=0.0)
            sup = contract.supervisor(
                store, adapter, write_model(tmp_path), tmp_path / "work", health_interval=0.1
            )
            await sup.ensure_running()
            adapter.readiness_path = "/h\u00e9alth"  # type: ignore[misc]
            async with anyio.create_task_group() as tg:
                tg.start_soon(sup.watch)
                with anyio.fail_after(10):
                    while sup.state != "fatal":
                        await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
            rows = [r for r in store.read_all() if r.stream_id == f"engine/{sup.key}"]
            return sup.pid, rows

    pid, rows = anyio.run(main)
    assert pid is None
    assert rows[-1].type == "engine.failed"
    assert "Altered) has a readiness_path that cannot be sent" in rows[-1].payload["error"]


@pytest.mark.parametrize("answer", ["yes", 1, None])
def test_an_on_exited_before_ready_hook_that_answers_junk_fails_the_engine(
    tmp_path: Path, answer: object
) -> None:
    """Asked after a start ended before ready (RD9): junk is the plugin's error, recorded."""

    class Exits(contract.Scripted):
        engine_type = "exits"

        def build_command(self, spec: LaunchSpec) -> LaunchCommand:
            return LaunchCommand([sys.executable, "-c", "raise SystemExit(3)"])

        def on_exited_before_ready(self, message: str) -> bool:
            return answer  # type: ignore[return-value]

    async def main() -> tuple[BaseException | None, list[str]]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(  # this daemon's engines are known: the hook is asked
                store, Exits(tmp_path), write_model(tmp_path), tmp_path / "work", owned=set
            )
            raised: BaseException | None = None
            try:
                await sup.ensure_running()
            except BaseException as exc:  # what the start ended with
                raised = exc
            types = [r.type for r in store.read_all() if r.stream_id == f"engine/{sup.key}"]
            return raised, types

    raised, types = anyio.run(main)
    assert isinstance(raised, PluginError), repr(raised)
    assert str(raised).endswith(f"Exits) returned {answer!r} from on_exited_before_ready")
    assert types[-2:] == ["engine.crashed", "engine.failed"], types


def test_an_abort_the_failed_start_never_read_does_not_abort_the_next_start(
    tmp_path: Path,
) -> None:
    """A stop asked while a start is on its way (before its readiness wait), which then fails.

    The abort flag it set is never read by that start; it must not abort the next one.
    """
    from hostler.drivers.offloop import OffLoop

    class Slow(OffLoop):
        async def run(self, func: Any, *args: object) -> Any:
            await anyio.sleep(0.2)  # every log write and rotation: time for a stop to come
            return await super().run(func, *args)

    class Flaky(contract.Scripted):
        broken = True

        def build_command(self, spec: LaunchSpec) -> LaunchCommand:
            if self.broken:
                return LaunchCommand([str(tmp_path / "no-such-engine")])
            return super().build_command(spec)

    async def main() -> tuple[BaseException | None, int | None]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            adapter = Flaky(tmp_path, load=0.0)
            key = "scripted:m:0"
            model = write_model(tmp_path)
            sup = Supervisor(
                key,
                adapter,
                lambda port: LaunchSpec(key, model, port, ctx_per_slot=256, work_dir=tmp_path),
                store,
                run_dir=tmp_path / "run",
                token_prefix="abort",
                offloop=Slow(),
            )
            failed: list[BaseException] = []

            async def start() -> None:
                try:
                    await sup.ensure_running()
                except BaseException as exc:  # what the start ended with
                    failed.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(start)
                with anyio.fail_after(10):
                    while sup.state != "starting":
                        await anyio.sleep(0.01)
                await sup.stop("user")  # the start is rotating its log: it never reads this
            assert "cannot run" in str(failed[0])
            adapter.broken = False
            try:
                port = await sup.ensure_running()
            except BaseException as exc:  # what the next start ended with
                return exc, None
            finally:
                await sup.stop()
            return None, port

    raised, port = anyio.run(main)
    assert raised is None, repr(raised)
    assert port is not None


def start_with_probe(tmp_path: Path, make_probe: object) -> BaseException | None:
    """Start the scripted engine with the probe ``make_probe()`` builds; what the start raised."""
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    class Probed(contract.Scripted):
        def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
            return make_probe()  # type: ignore[operator,no-any-return]

    async def main() -> BaseException | None:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, Probed(tmp_path, load=0.1), model, tmp_path / "work", startup_timeout=5.0
            )
            try:
                await sup.ensure_running()
            except BaseException as exc:
                assert sup.pid is None, "a failed start left its engine running"
                return exc
            finally:
                await sup.stop()
            return None

    return anyio.run(main)


def test_a_non_ascii_probe_path_fails_where_it_is_made(tmp_path: Path) -> None:
    """A probe path HTTP cannot carry is the plugin's error, never a stray exception.

    readiness.md: "An invalid probe fails where the adapter builds it: ValueError ...". Either
    ReadinessProbe refuses the path (ValueError), or the start fails as the plugin's error
    (PluginError / EngineStartError naming it) with nothing left running. Today
    ReadinessProbe.__post_init__ (hostler.plugin) checks only the leading '/': a non-ASCII
    path escapes Supervisor.ensure_running as a raw UnicodeEncodeError from
    hostler.engines.http.probe_response (`.encode("ascii")` of the request line). (A CR/LF
    or space in the path is also accepted and written verbatim into the request line.)
    """
    path = "/h\u00e9alth"
    try:
        ReadinessProbe(path=path)
    except ValueError:
        return  # refused where it is made: the documented behaviour
    raised = start_with_probe(tmp_path, lambda: ReadinessProbe(path=path))
    assert isinstance(raised, PluginError | EngineStartError), repr(raised)


def test_a_probe_method_other_than_get_or_post_fails_where_it_is_made() -> None:
    """`method` is GET or POST (readiness.md); anything else is a ValueError at construction.

    Today ReadinessProbe.__post_init__ (hostler.plugin) never looks at `method`: a
    Literal["GET", "POST"] is not enforced at run time, so `method="DELETE"` or a method
    holding CR/LF is accepted and sent to the engine as the request line.
    """
    for method in ("DELETE", "GET /other HTTP/1.1\r\nX: y\r\n\r\nGET", "get"):
        with pytest.raises(ValueError, match=r"(?i)method"):
            ReadinessProbe(path="/health", method=method)  # type: ignore[arg-type]


def start_adapter(tmp_path: Path, adapter_class: type[contract.Scripted]) -> BaseException | None:
    """Start ``adapter_class`` (a scripted engine) under the real supervisor; what it raised."""
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    async def main() -> BaseException | None:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, adapter_class(tmp_path, load=0.3), model, tmp_path / "work",
                startup_timeout=5.0,
            )  # fmt: skip
            try:
                await sup.ensure_running()
            except BaseException as exc:
                return exc
            finally:
                await sup.stop()
            return None

    return anyio.run(main)


def test_a_classify_line_hook_that_returns_junk_is_the_plugins_error(tmp_path: Path) -> None:
    """classify_line returning a non-Panic fails the start as a PluginError naming the hook.

    A readiness() that returns junk is already a PluginError naming the plugin
    (test_contract.py), and so is a classify_line that raises. Today a classify_line that
    *returns* junk (a str) escapes the supervisor as a raw AttributeError ("'str' object has
    no attribute 'fatal_at_startup'", hostler.engines.supervisor reading the line), not the
    plugin's error.
    """

    class Junk(contract.Scripted):
        def classify_line(self, line: str) -> object:  # type: ignore[override]
            return "fatal"

    raised = start_adapter(tmp_path, Junk)
    assert isinstance(raised, PluginError), repr(raised)
    assert "classify_line" in str(raised)


def test_an_is_ready_response_hook_that_returns_junk_is_the_plugins_error(
    tmp_path: Path,
) -> None:
    """is_ready_response must return a bool; anything else is the plugin's error, not 'ready'.

    Today the supervisor takes any truthy return as ready: an is_ready_response that returns
    the string "no" (or a dict, or a coroutine from an accidental `async def`) declares the
    engine ready while it is still loading, where a junk readiness() return is refused as a
    PluginError.
    """

    class Junk(contract.Scripted):
        def is_ready_response(self, status: int, body: bytes) -> bool:
            return "no"  # type: ignore[return-value]

    raised = start_adapter(tmp_path, Junk)
    assert isinstance(raised, PluginError), repr(raised)


def test_an_engine_that_died_before_its_stop_is_recorded_as_crashed_not_stopped(
    tmp_path: Path,
) -> None:
    """An engine SIGKILLed from outside, then stopped (an eviction) before the watch looked.

    Found with sd-cpp: kill sd-server mid-image; the render's client gets RemoteDisconnected,
    the `image` lease is released (good), the waiting chat's GA1 eviction then stops the
    already-dead sd-server 12 ms later, and the log says `engine.stop_requested
    reason=evicted` + `engine.stopped signal=9`: the crash is never recorded (no
    engine.crashed, no output tail, nothing for `hostler explain` or the restart budget).
    Cause: Supervisor._stop_locked (hostler.engines.supervisor) signals and reaps without
    asking whether the process had already exited, and records its status as the stop's.
    Expected: the death it did not cause is recorded as a crash (engine.crashed with
    signal 9), whatever stop was asked afterwards.
    """
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    async def main() -> list[str]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, contract.Scripted(tmp_path, load=0.0), model, tmp_path / "work",
                watch_interval=30.0,
            )  # fmt: skip
            await sup.ensure_running()
            pid = sup.pid
            assert pid is not None
            os.kill(pid, 9)  # the engine dies on its own (OOM killer, a bug, an operator)
            await anyio.sleep(0.3)  # it is dead; the watch has not looked yet
            await sup.stop("evicted", {"rule": "GA1"})
            return [r.type for r in store.read_all() if r.stream_id == f"engine/{sup.key}"]

    types = anyio.run(main)
    assert "engine.crashed" in types, types


DEEP_ENGINE = """
import http.server, sys
port = int(sys.argv[1])
BODY = b'{"a":' + b"[" * 30000 + b"]" * 30000 + b"}"
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *args):
        pass
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_a_deeply_nested_readiness_body_is_not_ready_not_a_recursion_error(
    tmp_path: Path,
) -> None:
    """An engine whose /health answers 200 with 60 KiB of nested arrays is simply not ready.

    With `ReadinessProbe(path="/health", expect_json={"status": "ok"})` the start must time
    out ("did not become ready within 3 s"), as for any body without the field. Today
    hostler.plugin.json_fields_match catches only ValueError/UnicodeDecodeError around
    json.loads, so the engine's body raises RecursionError straight out of
    Supervisor.ensure_running in 0.06 s: an engine's HTTP body crashes hostler's own code.
    """
    script = tmp_path / "deep_engine.py"
    script.write_text(DEEP_ENGINE)
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    class Deep(contract.Scripted):
        def build_command(self, spec: LaunchSpec) -> LaunchCommand:
            return LaunchCommand([sys.executable, str(script), str(spec.port), str(spec.model)])

        def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
            return ReadinessProbe(path="/health", expect_json={"status": "ok"})

    async def main() -> BaseException | None:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, Deep(tmp_path), model, tmp_path / "work", startup_timeout=3.0
            )
            try:
                await sup.ensure_running()
            except BaseException as exc:
                return exc
            finally:
                await sup.stop()
            return None

    raised = anyio.run(main)
    assert isinstance(raised, EngineStartError), repr(raised)
    assert "did not become ready" in str(raised)


class Hanging(FakeEngineAdapter):
    """The fake engine, probed on its /busy/60 endpoint: it accepts, then answers a minute later."""

    engine_type = "hanging"

    def readiness(self, spec: LaunchSpec) -> ReadinessProbe:
        return ReadinessProbe(path="/busy/60", wait=15)


def test_a_hanging_probe_does_not_stretch_the_start_timeout(tmp_path: Path) -> None:
    """The start's timeout bounds the whole wait, a probe in flight included.

    readiness.md: "After 180 s without readiness the start fails with `did not become ready
    within 180 s`". With startup_timeout=2 and a probe `wait=15` on an engine that accepts
    and never answers, today the start fails after ~15 s with the message "did not become
    ready within 2 s": the supervisor checks its deadline only between probes, and
    hostler.engines.http.probe_response runs for its full `wait` (up to 600 s).
    """
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    async def main() -> tuple[BaseException | None, float]:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, Hanging(), model, tmp_path / "work", startup_timeout=2.0
            )
            began = time.monotonic()
            try:
                await sup.ensure_running()
            except BaseException as exc:
                return exc, time.monotonic() - began
            finally:
                await sup.stop()
            return None, time.monotonic() - began

    raised, took = anyio.run(main)
    assert isinstance(raised, EngineStartError), repr(raised)
    assert took < 6.0, f"a 2 s start timeout ended after {took:.1f} s"


def test_a_stop_during_a_hanging_probe_ends_the_engine_promptly(tmp_path: Path) -> None:
    """A stop asked while the start waits on a hanging probe ends the engine in seconds.

    README: "SIGTERM stops every engine within 2 s whatever lock is held". Today
    Supervisor.stop() only sets an abort flag read "at its next readiness poll", which comes
    after the probe in flight times out: the stop takes the probe's `wait` (~14 s here; up to
    600 s for a legal probe), the engine running all along.
    """
    model = tmp_path / "model.bin"
    model.write_bytes(b"weights")

    async def main() -> float:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = contract.supervisor(
                store, Hanging(), model, tmp_path / "work", startup_timeout=120.0
            )

            async def start() -> None:
                with pytest.raises(EngineStartError):
                    await sup.ensure_running()

            async with anyio.create_task_group() as tg:
                tg.start_soon(start)
                await anyio.sleep(1.5)  # the first probe is in flight
                began = time.monotonic()
                await sup.stop()
                took = time.monotonic() - began
            assert sup.pid is None
            return took

    took = anyio.run(main)
    assert took < 5.0, f"the stop took {took:.1f} s"


def test_a_probe_whose_expect_json_is_no_mapping_is_the_plugins_error(tmp_path: Path) -> None:
    """A readiness probe whose expect_json is not a mapping fails as the plugin's error.

    SG3: a readiness answer that is not one becomes PluginError naming the plugin; RD1: a
    probe that cannot be used fails where it is made (ValueError). Today ReadinessProbe
    accepts ``expect_json="ready"`` and the supervisor's json_fields_match
    (hostler.plugin.json_fields_match, called from Supervisor._probe_ready outside _ask)
    raises a raw AttributeError ("'str' object has no attribute 'items'") out of
    ensure_running: neither a ValueError where it is made nor the plugin's error.
    """
    try:
        probe = ReadinessProbe(path="/health", expect_json="ready")  # type: ignore[arg-type]
    except ValueError:
        return  # refused where it is made: the promise holds

    class Liar(contract.Scripted):
        def readiness(self, spec):  # type: ignore[no-untyped-def]
            return probe

    raised = start_adapter(tmp_path, Liar)
    assert isinstance(raised, PluginError), repr(raised)


def test_a_probe_wait_that_is_no_number_of_seconds_fails_where_it_is_made() -> None:
    """ReadinessProbe.wait must be a number of seconds: a bool or a str fails as ValueError.

    RD7 says of every timing that "a bool, NaN or infinity is no number of seconds", and RD1
    that a probe that cannot be used fails where it is made (ValueError). Today
    ``wait=True`` is accepted as one second and ``wait="1"`` raises a TypeError of Python's
    own wording ("'<' not supported between instances of 'int' and 'str'") from
    ReadinessProbe.__post_init__ (hostler.plugin).
    """
    for wait in (True, "1"):
        with pytest.raises(ValueError, match=r"(?i)wait"):
            ReadinessProbe(path="/health", wait=wait)  # type: ignore[arg-type]
