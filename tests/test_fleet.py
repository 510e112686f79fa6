"""A fleet: daemons on two (simulated) hosts share one PostgreSQL log (docs/fleet.md).

Each host has its own data directory, ledger and budget (memory is per host), and its own part
of the shared database; every event names its host; the reading commands show the fleet and
filter by host. Real ``hostler serve`` processes, real llama-server engines, real PostgreSQL.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import ServeChild, kill_leftovers
from _postgres import throwaway_cluster
from _support import run_cli

BUDGET = 2 * 1024**3


def _models(folder: Path) -> str:
    for name in ("alpha", "beta"):
        write_tiny_llama(folder / f"{name}.gguf")
    return "".join(
        f'[[models]]\nid = "{n}"\npath = "{folder / f"{n}.gguf"}"\nctx = 512\n'
        for n in ("alpha", "beta")
    )


def _host(folder: Path, name: str, url: str) -> ServeChild:
    folder.mkdir()
    env = {"HOSTLER_DB": url, "HOSTLER_HOST_NAME": name, "HOSTLER_BUDGET_BYTES": str(BUDGET)}
    return ServeChild(folder, _models(folder), env=env)


def _chat(base: str, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)


@pytest.mark.slow
def test_two_hosts_share_one_log_and_the_fleet_is_told_by_host(tmp_path: Path, pg_url: str) -> None:
    one = _host(tmp_path / "one", "gpu1", pg_url)
    two = _host(tmp_path / "two", "gpu2", pg_url)
    try:
        answers: dict[str, int] = {}

        def ask(serve: ServeChild, host: str, model: str) -> None:
            answers[f"{host}/{model}"] = _chat(serve.base, model).status_code

        asks = [
            threading.Thread(target=ask, args=(one, "gpu1", "alpha")),
            threading.Thread(target=ask, args=(two, "gpu2", "alpha")),
            threading.Thread(target=ask, args=(two, "gpu2", "beta")),
        ]
        for thread in asks:
            thread.start()
        for thread in asks:
            thread.join()
        assert answers == {"gpu1/alpha": 200, "gpu2/alpha": 200, "gpu2/beta": 200}
        # the fleet's state, from the log alone, is what each daemon says it runs
        state = run_cli("state", "--db", pg_url, "--json")
        assert state.returncode == 0, state.stderr
        hosts = json.loads(state.stdout)["hosts"]
        assert sorted(hosts) == ["gpu1", "gpu2"]
        for name, serve in (("gpu1", one), ("gpu2", two)):
            runtime = hosts[name]["runtime"]
            recorded = {
                k: e["pid"] for k, e in runtime["engines"].items() if e["state"] == "running"
            }
            live = {e["key"]: e["pid"] for e in serve.get("/api/engines")["engines"]
                    if e["state"] == "running"}  # fmt: skip
            assert recorded == live
            # memory is per host: each host's own ledger keeps it within its own budget
            ledger = serve.get("/api/engines")["ledger"]
            assert ledger["explicit_budget"] == BUDGET
            assert 0 < ledger["committed"] <= BUDGET
            spawned = run_cli("events", "--db", pg_url, "--host-name", name, "--json",
                              "--type", "engine.spawned")  # fmt: skip
            launched = {}
            for line in spawned.stdout.splitlines():
                row = json.loads(line)
                launched[row["stream_id"]] = row["payload"]["launched"]["reserved_bytes"]
            assert 0 < sum(launched[f"engine/{k}"] for k in recorded) <= BUDGET
        assert [k for k, e in hosts["gpu1"]["runtime"]["engines"].items()
                if e["state"] == "running"] == ["llamacpp:alpha:0"]  # fmt: skip
        running_two = hosts["gpu2"]["runtime"]["engines"]
        assert sorted(k for k, e in running_two.items() if e["state"] == "running") == [
            "llamacpp:alpha:0",
            "llamacpp:beta:0",
        ]
        # one place to ask: by host, or the whole fleet
        only_two = run_cli("events", "--db", pg_url, "--host-name", "gpu2", "--json")
        rows = [json.loads(line) for line in only_two.stdout.splitlines()]
        assert rows and {r["metadata"]["host"] for r in rows} == {"gpu2"}
        table = run_cli("events", "--db", pg_url, "--type", "engine.ready")
        streams = sorted(line.split()[3] for line in table.stdout.splitlines()[1:])
        assert streams == [
            "gpu1:engine/llamacpp:alpha:0",
            "gpu2:engine/llamacpp:alpha:0",
            "gpu2:engine/llamacpp:beta:0",
        ]
        for command in (("replay", "--verify"), ("whatif", "--policy", "lru"), ("export",)):
            which = run_cli(*command, "--db", pg_url)  # one host's log each: which one?
            assert which.returncode == 2 and which.stderr.count("\n") == 1, which.stderr
            assert "add --host-name (hosts: gpu1, gpu2)" in which.stderr
        replayed = run_cli("replay", "--verify", "--db", pg_url, "--host-name", "gpu2")
        assert replayed.returncode == 0, replayed.stderr
        story = run_cli("explain", "alpha", "--db", pg_url)
        assert story.returncode == 0, story.stderr
        assert "HOST gpu1" in story.stdout and "HOST gpu2" in story.stdout
        # a second daemon for a host that has one is refused, in one line
        third = tmp_path / "three"
        third.mkdir()
        refused = run_cli(
            "serve", "--port", "0", "--data-dir", str(third / "data"),
            env={"HOSTLER_DB": pg_url, "HOSTLER_HOST_NAME": "gpu1", "HOSTLER_HOME": str(third)},
        )  # fmt: skip
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert "owned by another hostler daemon for host 'gpu1'" in refused.stderr
    finally:
        for serve in (one, two):
            serve.close()
            kill_leftovers(serve.data)


@pytest.mark.slow
def test_postgresql_down_keeps_what_runs_refuses_new_starts_and_catches_up(
    tmp_path: Path,
) -> None:
    """The shared log unreachable: running models keep answering; a start (a decision that must
    be recorded first) is refused 503 store-unavailable; once the server is back the start is
    served and the queue's events of the outage are in the log, in order."""
    with throwaway_cluster() as cluster:
        url = cluster.new_database()
        serve = _host(tmp_path / "one", "gpu1", url)
        try:
            assert _chat(serve.base, "alpha").status_code == 200
            cluster.stop("fast")
            during = [_chat(serve.base, "alpha") for _ in range(3)]
            assert [r.status_code for r in during] == [200, 200, 200]
            # what the operator asks keeps answering: what runs, and the metrics so far
            listed = serve.get("/api/engines")
            running = [e["key"] for e in listed["engines"] if e["state"] == "running"]
            assert running == ["llamacpp:alpha:0"] and listed["last_seq"] is None
            token = (serve.data / "token").read_text().strip()
            scraped = httpx.get(
                f"{serve.base}/metrics", headers={"authorization": f"Bearer {token}"}, timeout=30
            )
            assert scraped.status_code == 200, scraped.text
            assert "hostler_log_up 0.0" in scraped.text
            refused = _chat(serve.base, "beta")
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "store-unavailable"
            assert refused.headers["retry-after"] == "5"
            # the log refused the start: the engine did not fail, it was not started
            states = {e["key"]: e["state"] for e in serve.get("/api/engines")["engines"]}
            assert states["llamacpp:beta:0"] == "stopped", states
            cluster.start()
            assert _chat(serve.base, "beta").status_code == 200
            assert serve.get("/api/engines")["last_seq"] > 0
            assert _chat(serve.base, "alpha").status_code == 200
        finally:
            serve.close()
            kill_leftovers(serve.data)
        listed = run_cli("events", "--db", url, "--host-name", "gpu1", "--json")
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert not [r for r in rows if r["type"] == "engine.failed"], "a log outage is no failure"
        finished = [r for r in rows if r["type"] == "queue.released"]
        assert len(finished) >= 6  # alpha ×5 (3 while the server was down) and beta
        seqs = [r["seq"] for r in rows]
        assert seqs == sorted(seqs)
