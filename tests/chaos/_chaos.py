"""The chaos harness: a scripted workload through a real ``hostler serve``, a fault at a random
point, and the invariants checked from the log and the process table afterwards.

One *run* is one seed: start the daemon (on SQLite or a real PostgreSQL log), drive a workload
of streaming chats on three models that do not all fit (evictions), unloads, GPU leases and
budget changes from two client threads; inject one fault at a moment the seed chooses; recover;
then check:

- **answers**: every request was answered, or failed with a reason (an HTTP error with its
  code, a stream cut with its error event, or the daemon gone while it was killed) within its
  deadline — never a hang, never a bare disconnect while the daemon was up;
- **the log**: seqs strictly increase, every stream's versions run 1..n without a gap, and
  every event a reader saw committed during the run is still there after the crash;
- **memory**: while serving, each running engine has exactly one reservation in its host's
  ledger and no reservation is left without an engine (none leaked, none counted twice);
- **processes**: after the daemon stops (SIGTERM, which must end it), no engine of its data
  directory is left running, and its ledger holds no reservation.

The workload also asks ``/api/engines`` and ``/metrics`` throughout (a 500 anywhere is a
violation, as is a stream cut without an error event while the daemon was up).

Faults: ``daemon-kill`` (SIGKILL, then a new daemon on the same data directory and log),
``engine-kill`` (SIGKILL of a running engine, mid-stream), ``engine-stop`` (SIGSTOP for 3 s,
then SIGCONT), ``log-lock`` (SQLite: another process holds the write lock for 3 s),
``log-full`` (SQLite: the daemon's writes past the log's size fail for 3 s, ``RLIMIT_FSIZE``),
``pg-restart`` (PostgreSQL stopped, half the seeds as a crash (``-m immediate``), for 1 - 5 s).

Each run's outcome is appended as one JSON line to ``$HOSTLER_CHAOS_REPORT`` when it is set
(``docs/reliability.md`` is written from those lines).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from hostler import EventStore
from hostler.postmortem.snapshots import as_of
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama

from _daemons import ServeChild, token_holders
from _postgres import Cluster

#: 44 layers of 2 KV heads of 64: 22 KiB of f16 KV a token; at ctx 16384 each model is priced
#: near 360 MiB, so two of the three fit a 1 GiB budget and the third evicts one.
DEEP = TinyModel(layers=44, embd=128, heads=2, kv_heads=2, ff=128, ctx=16384, f16=True)
MODELS = ("alpha", "beta", "gamma")
GIB = 2**30
#: Seconds a request may take before it counts as a hang (a violation).
DEADLINE = 60.0
#: The event types a run's report counts (the whole log so far: a chain's seeds share it).
_COUNTED = frozenset(
    {"daemon.started", "engine.ready", "engine.crashed", "engine.stop_requested", "engine.adopted"}
)
FAULTS = ("daemon-kill", "engine-kill", "engine-stop", "log-lock", "log-full", "pg-restart")


def write_models(folder: Path) -> Path:
    """The three models (written once per folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        if not (folder / f"{name}.gguf").exists():
            write_tiny_llama(folder / f"{name}.gguf", DEEP)
    return folder


def _config(models: Path) -> str:
    return "".join(
        f'[[models]]\nid = "{n}"\npath = "{models / f"{n}.gguf"}"\nctx = 16384\nkv_type = "f16"\n'
        for n in MODELS
    )


@dataclass
class Outcome:
    """One request of the workload and how it ended."""

    action: str
    started: float
    ended: float
    status: int | None
    reason: str


@dataclass
class RunReport:
    """One seed's run: what was done, what was seen, and what broke (``violations``)."""

    seed: int
    fault: str
    log: str
    fault_at: float = 0.0
    requests: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    recovery_seconds: float | None = None
    #: daemon-kill: seconds from the SIGKILL until the new daemon answered /health.
    down_seconds: float | None = None
    events: int = 0
    #: How many of the events that show the workload did its job the log holds (evictions...).
    counts: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


class _Tail(threading.Thread):
    """A reader polling the log during the run: what it saw committed must survive anything."""

    def __init__(self, target: str) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.seen: dict[int, tuple[str, int, str]] = {}
        self.stop = threading.Event()
        self.errors = 0

    def run(self) -> None:
        after = 0
        while not self.stop.wait(0.05):
            try:
                with EventStore.open(self.target) as store:
                    while not self.stop.is_set():
                        for r in store.read_all(after_seq=after):
                            self.seen[r.seq] = (r.stream_id, r.version, r.type)
                            after = r.seq
                        time.sleep(0.05)
            except Exception:
                self.errors += 1


class ChaosRun:
    """One seed's run against one data directory (reused across seeds, as a restart would)."""

    def __init__(
        self,
        folder: Path,
        models: Path,
        seed: int,
        fault: str,
        cluster: Cluster | None,
        *,
        serve: ServeChild | None = None,
    ) -> None:
        self.folder = folder
        self.rng = random.Random(seed)  # noqa: S311 - a seed to replay, not a secret
        self.fault = fault
        self.cluster = cluster
        self.db = cluster.url("chaos") if cluster is not None else None
        self.report = RunReport(seed, fault, "postgresql" if cluster else "sqlite")
        self.models = models
        self.outcomes: list[Outcome] = []
        self.down: list[tuple[float, float]] = []  # windows the daemon was not there
        self.faulted: list[tuple[float, float]] = []  # windows a fault was in force
        self.serve = serve  # the daemon a previous seed left running
        self._lock = threading.Lock()

    @property
    def log_target(self) -> str:
        """The daemon's log, as a reader opens it."""
        return self.db or str(self.folder / "data" / "events.db")

    def _daemon(self) -> ServeChild:
        assert self.serve is not None
        return self.serve

    def start(self) -> None:
        """Start ``hostler serve`` on the run's data directory and log."""
        env = {"HOSTLER_BUDGET_BYTES": str(GIB), "HOSTLER_IDLE_TIMEOUT": "0"}
        if self.db is not None:
            env["HOSTLER_DB"] = self.db
        self.serve = ServeChild(self.folder, _config(self.models), env=env)

    # -- the workload --------------------------------------------------------------------

    def _record(self, action: str, started: float, status: int | None, reason: str) -> None:
        with self._lock:
            self.outcomes.append(Outcome(action, started, time.monotonic(), status, reason))

    def _token(self) -> str:
        return (self._daemon().data / "token").read_text().strip()

    def _one(self, client: httpx.Client, rng: random.Random) -> None:
        base = self._daemon().base
        headers = {"authorization": f"Bearer {self._token()}"}
        roll = rng.random()
        started = time.monotonic()
        action = "chat"
        try:
            if roll < 0.65:
                model = rng.choice(MODELS)
                action = f"chat {model}"
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": "tell me"}],
                    "max_tokens": rng.randint(4, 48),
                    "stream": True,
                }
                with client.stream("POST", f"{base}/v1/chat/completions", json=body) as answer:
                    if answer.status_code != 200:
                        answer.read()
                        self._record(action, started, answer.status_code, _code(answer))
                        return
                    last = ""
                    for line in answer.iter_lines():
                        if line.startswith("data: "):
                            last = line[6:]
                    reason = "ok" if last == "[DONE]" else f"cut: {_stream_error(last)}"
                    self._record(action, started, 200, reason)
            elif roll < 0.72:  # what an operator or a scraper asks, fault or not
                action = rng.choice(["ps", "metrics"])
                path = "/api/engines" if action == "ps" else "/metrics"
                answer = client.get(f"{base}{path}", headers=headers)
                self._record(action, started, answer.status_code, _code(answer))
            elif roll < 0.8:
                model = rng.choice(MODELS)
                action = f"unload {model}"
                answer = client.post(
                    f"{base}/api/engines/llamacpp:{model}:0/unload", headers=headers
                )
                self._record(action, started, answer.status_code, _code(answer))
            elif roll < 0.9:
                action = "lease"
                answer = client.post(
                    f"{base}/api/leases", json={"slot": "image", "holder": "chaos"}, headers=headers
                )
                if answer.status_code == 200:
                    lease = answer.json()["id"]
                    time.sleep(rng.uniform(0.05, 0.3))
                    answer = client.delete(f"{base}/api/leases/{lease}", headers=headers)
                self._record(action, started, answer.status_code, _code(answer))
            else:
                action = "budget"
                size = rng.choice([GIB, 2 * GIB])
                answer = client.put(f"{base}/api/budget", json={"bytes": size}, headers=headers)
                self._record(action, started, answer.status_code, _code(answer))
        except httpx.TimeoutException:
            self._record(action, started, None, "timeout")
        except httpx.TransportError as exc:
            self._record(action, started, None, f"no answer: {type(exc).__name__}")
            time.sleep(0.1)  # as a client would: not a busy loop while the daemon is away

    def _workload(self, stop: threading.Event, seed: int) -> None:
        rng = random.Random(seed)  # noqa: S311 - a seed to replay, not a secret
        with httpx.Client(timeout=DEADLINE) as client:
            while not stop.is_set():
                self._one(client, rng)

    # -- faults --------------------------------------------------------------------------

    def _running_engine_pid(self) -> int | None:
        try:
            listed = self._daemon().get("/api/engines")["engines"]
        except OSError:
            return None
        pids = [e["pid"] for e in listed if e["state"] == "running" and e["pid"]]
        return self.rng.choice(pids) if pids else None

    def inject(self) -> None:
        """The seed's fault, now."""
        began = time.monotonic()
        if self.fault == "daemon-kill":
            self._daemon().kill()
            killed = time.monotonic()
            self._daemon().start()
            self.down.append((killed, time.monotonic()))
            self.report.down_seconds = round(time.monotonic() - killed, 2)
        elif self.fault == "engine-kill":
            pid = self._running_engine_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        elif self.fault == "engine-stop":
            pid = self._running_engine_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                time.sleep(3)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        elif self.fault == "log-lock":
            held = sqlite3.connect(self.log_target, timeout=30)
            try:
                held.execute("BEGIN EXCLUSIVE")
                time.sleep(3)
            finally:
                held.rollback()
                held.close()
        elif self.fault == "log-full":
            with _disk_full(self._daemon().daemon.pid, Path(self.log_target)):
                time.sleep(3)
        elif self.fault == "pg-restart":
            assert self.cluster is not None
            # every other seed as a crash of the server (immediate: no shutdown checkpoint)
            self.cluster.stop("immediate" if self.rng.random() < 0.5 else "fast")
            time.sleep(self.rng.uniform(1, 5))
            self.cluster.start()
        self.faulted.append((began, time.monotonic()))

    # -- the run -------------------------------------------------------------------------

    def run(self, seed: int, *, stop: bool = True) -> RunReport:
        """Workload, the fault at a random moment, recovery; then every invariant.

        ``stop``: end with SIGTERM and the checks of a stopped daemon (else the daemon stays up
        for the next seed, as after any restart, and only the running checks are made).
        """
        if self.serve is None or self.serve.daemon.poll() is not None:
            self.start()
        tail = _Tail(self.log_target)
        tail.start()
        halt = threading.Event()
        workers = [
            threading.Thread(target=self._workload, args=(halt, seed * 2 + i), daemon=True)
            for i in range(2)
        ]
        for worker in workers:
            worker.start()
        self.report.fault_at = round(self.rng.uniform(0.3, 2.5), 2)
        time.sleep(self.report.fault_at)
        self.inject()
        recovered = self._recovery()
        self.report.recovery_seconds = recovered
        halt.set()
        for worker in workers:
            worker.join(DEADLINE + 30)
            if worker.is_alive():
                self.report.violations.append("a client thread hung past its deadline")
        self._check_memory()
        if stop:
            self._stop_and_check()
        self._caught_up(tail)
        tail.stop.set()
        tail.join(30)
        self._check_log(tail.seen)
        if self.report.events and not tail.seen:
            self.report.violations.append("the reader saw nothing: the log check proved nothing")
        self._check_answers()
        return self.report

    def _recovery(self) -> float | None:
        """Seconds until a model the seed picks answers again after the fault (None: never)."""
        began = time.monotonic()
        for model in [self.rng.choice(MODELS)]:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            }
            while True:
                try:
                    answer = httpx.post(
                        f"{self._daemon().base}/v1/chat/completions", json=body, timeout=DEADLINE
                    )
                    if answer.status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() - began > 2 * DEADLINE:
                    self.report.violations.append(f"{model}: not served again after the fault")
                    return None
                time.sleep(0.2)
        return round(time.monotonic() - began, 2)

    # -- invariants ----------------------------------------------------------------------

    def _caught_up(self, tail: _Tail) -> None:
        """The reader reached the log's end: its check covers the whole run, not a start."""
        with EventStore.open(self.log_target) as store:
            last = store.last_seq()
        deadline = time.monotonic() + 30
        while (max(tail.seen) if tail.seen else 0) < last:
            if time.monotonic() > deadline or not tail.is_alive():
                self.report.violations.append(
                    f"the reader stopped at seq {max(tail.seen, default=0)} of {last} "
                    f"({tail.errors} read errors)"
                )
                return
            time.sleep(0.05)

    def _check_memory(self) -> None:
        """Each running engine holds one reservation; none is held for an engine not running."""
        daemon = self._daemon()
        deadline = time.monotonic() + 30
        while True:  # a stop under way settles first (its release follows the exit)
            engines = daemon.get("/api/engines")["engines"]
            if not any(e["state"] in ("starting", "stopping") for e in engines):
                break
            if time.monotonic() > deadline:
                self.report.violations.append("engines did not settle within 30 s")
                return
            time.sleep(0.1)
        running = sorted(e["key"] for e in engines if e["state"] == "running")
        held = _ledger_keys(daemon.data.parent / "ledger.db")
        if sorted(held) != running:
            self.report.violations.append(f"ledger holds {sorted(held)} while {running} run")
        # an orphan: an engine of this data directory that the daemon does not know it runs
        prefix = (daemon.data / "daemon-id").read_text().strip()
        known = {e["pid"] for e in engines if e["pid"]}
        orphans = sorted(p.pid for p in token_holders(prefix) if p.pid not in known)
        if orphans:
            self.report.violations.append(f"orphan engines while serving: {orphans}")

    def _stop_and_check(self) -> None:
        """SIGTERM ends the daemon; no engine of it is left; its ledger holds nothing."""
        daemon = self._daemon()
        prefix = (daemon.data / "daemon-id").read_text().strip()
        daemon.daemon.send_signal(signal.SIGTERM)
        try:
            status = daemon.daemon.wait(timeout=60)
        except Exception:
            self.report.violations.append("the daemon did not stop within 60 s of SIGTERM")
            daemon.daemon.kill()
            return
        if status != 0:
            self.report.violations.append(f"the daemon exited {status} on SIGTERM")
        left = token_holders(prefix)
        if left:
            self.report.violations.append(f"orphan engines: {[p.pid for p in left]}")
            for process in left:
                with contextlib.suppress(Exception):
                    process.kill()
        held = _ledger_keys(daemon.data.parent / "ledger.db")
        if held:
            self.report.violations.append(f"reservations leaked past the stop: {held}")

    def _check_log(self, seen: dict[int, tuple[str, int, str]]) -> None:
        with EventStore.open(self.log_target) as store:
            rows = [(r.seq, r.stream_id, r.version, r.type) for r in store.read_all()]
        self.report.events = len(rows)
        shown = Counter(kind for _, _, _, kind in rows if kind in _COUNTED)
        self.report.counts = dict(sorted(shown.items()))
        seqs = [r[0] for r in rows]
        if seqs != sorted(set(seqs)):
            self.report.violations.append("seqs are not strictly increasing")
        versions: dict[str, list[int]] = {}
        for _, stream, version, _ in rows:
            versions.setdefault(stream, []).append(version)
        for stream, found in versions.items():
            if found != list(range(1, len(found) + 1)):
                self.report.violations.append(f"{stream}: versions {found[:10]} have a gap")
        stored = {seq: (stream, version, kind) for seq, stream, version, kind in rows}
        lost = [seq for seq, row in seen.items() if stored.get(seq) != row]
        if lost:
            self.report.violations.append(f"committed events lost: seqs {lost[:10]}")

    def _check_answers(self) -> None:
        self.report.requests = len(self.outcomes)
        reasons: Counter[str] = Counter()
        for outcome in self.outcomes:
            reason = outcome.reason
            reasons[reason.split(":")[0] if reason.startswith("no answer") else reason] += 1
            if outcome.ended - outcome.started > DEADLINE + 5 or reason == "timeout":
                self.report.violations.append(f"{outcome.action}: no answer within its deadline")
            elif outcome.status is None and not self._during(self.down, outcome):
                self.report.violations.append(f"{outcome.action}: {reason} while the daemon was up")
            elif outcome.status is not None and outcome.status >= 400 and reason in ("", "?"):
                self.report.violations.append(f"{outcome.action}: {outcome.status} without a code")
            elif outcome.status == 500:  # a bug's answer ("internal"), never a fault's
                self.report.violations.append(f"{outcome.action}: 500 {reason}")
            elif reason == "cut: no error event" and not self._during(self.down, outcome):
                self.report.violations.append(
                    f"{outcome.action}: a stream cut without an error event while the daemon was up"
                )
        self.report.reasons = dict(sorted(reasons.items()))

    @staticmethod
    def _during(windows: list[tuple[float, float]], outcome: Outcome) -> bool:
        return any(a - 0.5 <= outcome.ended and outcome.started <= b + 0.5 for a, b in windows)


def _code(answer: httpx.Response) -> str:
    """The error code of a JSON error answer ("ok" for a 2xx)."""
    if answer.status_code < 300:
        return "ok"
    try:
        error = answer.json().get("error", {})
    except ValueError:
        return "?"
    return str(error.get("code") or "?") if isinstance(error, dict) else "?"


def _stream_error(data: str) -> str:
    try:
        error = json.loads(data).get("error", {})
    except (ValueError, AttributeError):
        return "no error event"
    return str(error.get("code") or "no code") if isinstance(error, dict) else "no error event"


def _ledger_keys(ledger: Path) -> list[str]:
    """The engine keys the host's ledger holds reservations for (its fold, as ``hostler state``
    shows it)."""
    with EventStore.open(ledger) as store:
        held = as_of(store, None).state.ledger.reservations.values()
    return sorted(h.key for h in held)


@contextlib.contextmanager
def _disk_full(pid: int, log: Path) -> Iterator[None]:
    """The daemon's writes past the log's current size fail (EFBIG), as on a full disk."""
    import psutil

    process = psutil.Process(pid)
    soft, hard = process.rlimit(psutil.RLIMIT_FSIZE)
    sizes = [p.stat().st_size for p in (log, Path(f"{log}-wal")) if p.exists()]
    # the soft limit only: raising a hard limit again needs a privilege a container may lack
    process.rlimit(psutil.RLIMIT_FSIZE, (max(sizes), hard))
    try:
        yield
    finally:
        process.rlimit(psutil.RLIMIT_FSIZE, (soft, hard))


def append_report(report: RunReport) -> None:
    """One JSON line to ``$HOSTLER_CHAOS_REPORT`` (when set)."""
    where = os.environ.get("HOSTLER_CHAOS_REPORT")
    if where:
        with Path(where).open("a", encoding="utf-8") as out:
            out.write(json.dumps(asdict(report)) + "\n")


__all__ = [
    "DEADLINE",
    "FAULTS",
    "ChaosRun",
    "RunReport",
    "append_report",
    "write_models",
]
