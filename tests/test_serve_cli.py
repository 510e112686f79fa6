"""``hostler serve`` as a real process: the daemon with its HTTP face, real engines, real HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hostler.config import discovered_config, with_places
from hostler.drivers.model_walk import Surveyed, survey
from hostler.policies.offer import Offer
from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import kill_leftovers, served_port, start_daemon, token_holders
from _support import run_cli


def prefix_of(data: Path) -> str:
    return (data / "daemon-id").read_text().strip()


def write_config(tmp_path: Path) -> Path:
    for name in ("alpha", "beta"):
        write_tiny_llama(tmp_path / f"{name}.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        + "".join(
            f'\n[[engines]]\nkey = "llamacpp:{n}:0"\nmodel = "{n}.gguf"\nctx = 512\n'
            "autostart = false\n"
            for n in ("alpha", "beta")
        )
    )
    return config


@pytest.mark.slow
def test_serve_answers_openai_requests_and_stops_its_engines(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    server = start_daemon(write_config(tmp_path), data, log, command="serve", extra=("--port", "0"))
    try:
        port = served_port(log)
        base = f"http://127.0.0.1:{port}"
        models = httpx.get(f"{base}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["alpha", "beta"]
        body = {"model": "beta", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answer = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"]
        preview = httpx.get(f"{base}/api/preview/llamacpp:alpha:0", timeout=30).json()
        assert preview["reserved_bytes"] > 0 and preview["slots"] == 1
        unknown = httpx.get(f"{base}/api/preview/llamacpp:gamma:0", timeout=30)
        assert unknown.status_code == 404
        token = (data / "token").read_text().strip()
        assert (data / "token").stat().st_mode & 0o777 == 0o600
        unload = f"{base}/api/engines/llamacpp:beta:0/unload"
        assert httpx.post(unload, timeout=30).status_code == 401
        headers = {"authorization": f"Bearer {token}"}
        assert httpx.post(unload, headers=headers, timeout=30).json()["unloaded"] is True
        httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)  # loaded again
        assert len(token_holders(prefix_of(data))) == 1
        table = run_cli("ps", "--url", base)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split()[:3] == ["KEY", "MODEL", "STATE"]
        beta = next(line for line in lines if line.startswith("llamacpp:beta:0"))
        assert beta.split()[1:3] == ["beta", "running"] and "MiB" in beta
        assert beta.endswith("started (one-shot)")
        alpha = next(line for line in lines if line.startswith("llamacpp:alpha:0"))
        assert alpha.split()[2] == "stopped"
        listed = json.loads(run_cli("ps", "--url", base, "--json").stdout)
        states = {e["key"]: e["state"] for e in listed["engines"]}
        assert states == {"llamacpp:alpha:0": "stopped", "llamacpp:beta:0": "running"}
        running = next(e for e in listed["engines"] if e["key"] == "llamacpp:beta:0")
        assert running["reserved_bytes"] > 0 and running["measured_bytes"] > 0
        assert running["last_reason"] == "started (one-shot)"
        # load shows each step of the real llama-server's start as it happens
        loaded = run_cli("load", "alpha", "--url", base, "--data-dir", str(data))
        assert loaded.returncode == 0, loaded.stderr
        steps = [line.split(None, 1)[1] for line in loaded.stdout.splitlines()]
        assert steps[0] == "starting llamacpp:alpha:0 (one-shot)"
        spawned = next(i for i, s in enumerate(steps) if s.startswith("spawned llamacpp:alpha:0"))
        pid = int(steps[spawned].split("pid ")[1].split(",")[0])
        assert steps.index("ready llamacpp:alpha:0") > spawned
        summary = loaded.stdout.splitlines()[-1]
        assert re.fullmatch(r"alpha: loaded as llamacpp:alpha:0 in \d+\.\d s", summary), summary
        listed = json.loads(run_cli("ps", "--url", base, "--json").stdout)
        assert {e["key"]: e["pid"] for e in listed["engines"]}["llamacpp:alpha:0"] == pid
        plan = run_cli("preview", "alpha", "--url", base, "--json")
        assert plan.returncode == 0, plan.stderr
        assert json.loads(plan.stdout)["key"] == "llamacpp:alpha:0"
        models = json.loads(run_cli("models", "--url", base, "--json").stdout)
        assert [(m["id"], m["resident"]) for m in models] == [("alpha", True), ("beta", True)]
        missing = run_cli("load", "gamma", "--url", base, "--data-dir", str(data))
        assert missing.returncode == 1 and "model_not_found" not in missing.stderr
        assert "404: model 'gamma' is not configured here" in missing.stderr
        unloaded = run_cli("unload", "llamacpp:alpha:0", "--url", base, "--data-dir", str(data))
        assert unloaded.stdout == "llamacpp:alpha:0: unloaded\n"
        again = run_cli("unload", "alpha", "--url", base, "--data-dir", str(data))  # a model id
        assert again.stdout == "alpha: was not loaded\n"
        by_model = run_cli("unload", "beta", "--url", base, "--data-dir", str(data))
        assert by_model.stdout == "llamacpp:beta:0: unloaded\n"
        no_such = run_cli("unload", "gamma", "--url", base, "--data-dir", str(data))
        assert no_such.returncode == 2 and no_such.stderr == (
            "hostler: error [usage.invalid]: unload: 'gamma' is neither a model id nor an "
            "engine key (models: alpha, beta; `hostler ps` lists the keys)\n"
        )
        no_token = run_cli("unload", "llamacpp:beta:0", "--url", base, "--token", "wrong")
        # (beta is unloaded already: the token is refused before anything is looked at)
        assert no_token.returncode == 1 and "401" in no_token.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        kill_leftovers(data)
    assert token_holders(prefix_of(data)) == []


@pytest.mark.slow
def test_serve_refuses_a_bad_port_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    server = start_daemon(
        write_config(tmp_path), data, log, command="serve", extra=("--port", "70000")
    )
    assert server.wait(60) == 2
    assert "a port from 0 to 65535, not '70000'" in log.read_text()


@pytest.mark.slow
def test_ps_without_a_daemon_is_one_line(tmp_path: Path) -> None:
    result = run_cli("ps", "--url", "http://127.0.0.1:9", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("hostler: error [daemon.unreachable]: no hostler serve answers")
    assert result.stderr.count("\n") == 1


def test_discovered_config_takes_every_model_file_once(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in (
        "SmolLM2 135M.Q4.gguf",
        "big-00001-of-00002.gguf",
        "big-00002-of-00002.gguf",
        "a.gguf",
        "notes.txt",
    ):
        (models / name).write_bytes(b"GGUF")
    (models / "folder.gguf").mkdir()
    # searched recursively: nested folders, a name taken twice, a projector, a symlink loop
    nested = models / "org" / "repo"
    nested.mkdir(parents=True)
    (nested / "deep.Q8_0.gguf").write_bytes(b"GGUF")
    (nested / "a.gguf").write_bytes(b"GGUF")
    (nested / "mmproj-model-f16.gguf").write_bytes(b"GGUF")
    (nested / "loop").symlink_to(models, target_is_directory=True)
    too_deep = models.joinpath(*"abcdefghi")  # 9 folders: one more than MAX_DEPTH
    too_deep.mkdir(parents=True)
    (too_deep / "lost.gguf").write_bytes(b"GGUF")
    config = with_places(discovered_config(tmp_path), {})
    assert config.data_dir == tmp_path.resolve()
    assert config.engines == ()  # found while serving, by the daemon's catalog
    assert config.discovery is not None
    assert config.discovery.places == (("models", tmp_path.resolve() / "models"),)  # no HOME
    found = survey(config.discovery.places, before=(), taken=(), now=0.0, settle=0.0)
    assert {m.id: Path(m.path).relative_to(tmp_path.resolve()) for m in found.offer.offered} == {
        "a": Path("models/a.gguf"),
        "a-2": Path("models/org/repo/a.gguf"),
        "big": Path("models/big-00001-of-00002.gguf"),
        "deep.q8_0": Path("models/org/repo/deep.Q8_0.gguf"),
        "smollm2-135m.q4": Path("models/SmolLM2 135M.Q4.gguf"),
    }
    refused = {Path(r.path).name: r.reason for r in found.refused}
    assert refused["mmproj-model-f16.gguf"].startswith("a multimodal projector (mmproj)")
    assert refused["i"] == "over 8 folders deep: not searched"
    empty = with_places(discovered_config(tmp_path / "empty"), {})
    assert empty.discovery is not None
    assert survey(empty.discovery.places, before=(), taken=(), now=0.0, settle=0.0) == (
        Surveyed(Offer((), ()), (), 0)
    )


@pytest.mark.slow
def test_serve_without_a_config_serves_the_models_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    write_tiny_llama(data / "models" / "tiny.gguf")
    log = tmp_path / "serve.log"
    with log.open("ab") as out:
        server = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from hostler.cli import main; sys.exit(main())",
                "serve",
                "--data-dir",
                str(data),
                "--port",
                "0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HOSTLER_LEDGER": str(tmp_path / "ledger.db")},
        )
    try:
        port = served_port(log)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        kill_leftovers(data)


@contextlib.contextmanager
def serving(
    tmp_path: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[str, dict[str, str], Path]]:
    """A real ``hostler serve`` on a free port: (base URL, auth headers, data dir)."""
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    server = start_daemon(
        write_config(tmp_path), data, log, command="serve", extra=("--port", "0"), env=env
    )
    try:
        base = f"http://127.0.0.1:{served_port(log, 30)}"
        token = (data / "token").read_text().strip()
        yield base, {"authorization": f"Bearer {token}"}, data
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        kill_leftovers(data)


def test_an_abandoned_lease_request_is_never_granted_to_nobody(tmp_path: Path) -> None:
    """Promised: a client that disconnects frees its place (docs/serve.md, app.py docstring:
    "A client that disconnects — queued, loading or mid-answer — ends its request at once").

    Instead: ``POST /api/leases`` that waits for the card (swap arbiter) is not cancelled
    when its client leaves. When the card frees, the arbiter grants the lease to the vanished
    client (``GET /api/leases`` shows ``"holder": "ghost", "state": "held"``, expiring 1.5 h
    later), with an id nobody has: every LLM request then waits ("llm work waits for the
    image lease") until the lease expires.
    """
    with serving(tmp_path, env={"HOSTLER_ARBITER": "swap"}) as (base, auth, _data):
        first = httpx.post(
            f"{base}/api/leases", json={"slot": "image", "holder": "one"}, headers=auth
        ).json()
        with pytest.raises(httpx.TimeoutException):  # waits for the card; the client gives up
            httpx.post(
                f"{base}/api/leases",
                json={"slot": "image", "holder": "ghost"},
                headers=auth,
                timeout=1,
            )
        released = httpx.delete(f"{base}/api/leases/{first['id']}", headers=auth).json()
        assert released == {"released": True}
        time.sleep(1)
        held = [lease for lease in httpx.get(f"{base}/api/leases").json()]
        assert [(x["holder"], x["state"]) for x in held if x["state"] == "held"] == []


def test_a_listed_lease_can_be_released_by_its_listed_id(tmp_path: Path) -> None:
    """Promised: leases "acquire / release / list" (issue 10; docs/serve.md
    ``GET /api/leases`` / ``DELETE /api/leases/{id}``).

    Instead: the ``id`` that ``GET /api/leases`` lists is the arbiter's id, while
    ``DELETE /api/leases/{id}`` only knows the random id the POST answered (operator.py keeps
    its own ``releases`` dict). An operator who lists the leases to free a stuck one gets
    ``{"released": false}`` and the lease stays held.
    """
    with serving(tmp_path, env={"HOSTLER_ARBITER": "swap"}) as (base, auth, _data):
        httpx.post(f"{base}/api/leases", json={"slot": "image", "holder": "one"}, headers=auth)
        listed = httpx.get(f"{base}/api/leases").json()
        assert len(listed) == 1
        answer = httpx.delete(f"{base}/api/leases/{listed[0]['id']}", headers=auth).json()
        assert answer == {"released": True}
        assert httpx.get(f"{base}/api/leases").json() == []


def _serve_cli(tmp_path: Path, *extra: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return run_cli(
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
        *extra,
        env={"HOSTLER_HOME": str(tmp_path / "home"), **(env or {})},
        timeout=30,
    )


def test_a_port_in_use_is_refused_in_one_line(tmp_path: Path) -> None:
    """Promised: "cannot be bound (in use, not ours), said in one line" (serve/server.py
    HttpServer docstring); README: "a mistake is one line naming the cause, never a traceback".
    A second ``hostler serve`` on the port of a first is the everyday way to hit it.

    Instead: a ~50-line ``ExceptionGroup: unhandled errors in a TaskGroup`` traceback ending in
    ``hostler.errors.UsageError: cannot listen on 127.0.0.1:PORT (Address already in use)``.
    """
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = _serve_cli(tmp_path, "--port", str(port))
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout, (result.stderr + result.stdout)[-800:]
    assert "Address already in use" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-800:]


@pytest.mark.parametrize("host", ["999.1.1.1", "no-such-host.invalid", "::::"])
def test_a_host_that_cannot_be_resolved_is_refused_in_one_line(tmp_path: Path, host: str) -> None:
    """Promised: ``HOSTLER_HOST`` / ``--host`` take "an address or host name"; a malformed one is
    "refused before anything is created, in one line naming it" (docs/serve.md, Configuration).

    Instead: a host that passes the syntax check but cannot be bound (``999.1.1.1``, a name that
    does not resolve, ``::::``) ends in a Python traceback (``ExceptionGroup: unhandled errors in
    a TaskGroup`` ... ``UsageError: cannot listen on 999.1.1.1:0 (Name or service not known)``),
    after the data directory and log were made.
    """
    result = _serve_cli(tmp_path, "--port", "0", env={"HOSTLER_HOST": host})
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout, (result.stderr + result.stdout)[-800:]
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr[-800:]


def test_an_existing_token_file_readable_by_others_is_not_used_as_is(tmp_path: Path) -> None:
    """Promised: the bearer token is "stored 0600" (issue 10; docs/serve.md "The token").

    Instead: a ``DATA_DIR/token`` that already exists with mode 0644 (restored from a backup,
    copied with ``cp``, made by a sloppy script) is read and used as the daemon's secret
    without a word; it stays world-readable (mode 0o644 after ``hostler serve`` started), so
    every local user can call every state-changing route.
    """
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    token = data / "token"
    token.write_text("k" * 43 + "\n")
    token.chmod(0o644)
    log = tmp_path / "serve.log"
    server = start_daemon(write_config(tmp_path), data, log, command="serve", extra=("--port", "0"))
    try:
        with contextlib.suppress(AssertionError):
            served_port(log, 30)
        refused = server.poll() is not None and "token" in log.read_text()
        assert refused or token.stat().st_mode & 0o077 == 0, oct(token.stat().st_mode)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
        kill_leftovers(data)


@pytest.mark.slow
def test_a_full_disk_is_not_answered_as_a_bug(tmp_path: Path) -> None:
    """Promised: "The daemon survives its storage: ... a full disk ... never takes it down"
    (README), and a 500 ``internal`` is "a bug ... please report it" (docs/serve.md); every
    other failure has a stable code, 502/503 with ``Retry-After`` where waiting helps
    (issue 10: "no 5xx on any generated input" except the documented 502/503).

    Instead: with the data directory's disk full, ``POST /v1/chat/completions`` answers
    ``500 {"code": "internal", "message": "llamacpp:alpha:0: 'start' not done: the event log
    cannot record it (.../events.db: the disk is full ...)"}`` — the "please report it" bug
    answer, no ``Retry-After``, although the daemon says it retries and recovers once space
    is freed (it does).
    """
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(small)],
        check=False,
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr!r}")
    data = small / "data"
    log = tmp_path / "serve.log"
    server = start_daemon(write_config(tmp_path), data, log, command="serve", extra=("--port", "0"))
    try:
        base = f"http://127.0.0.1:{served_port(log, 30)}"
        fd = os.open(small / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert httpx.get(f"{base}/health", timeout=5).status_code == 200
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] != "internal"
        assert "retry-after" in answer.headers
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        kill_leftovers(data)
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_a_401_names_the_data_directory_whose_token_was_sent_and_the_fix(tmp_path: Path) -> None:
    """Was: ``hostler unload`` without ``--data-dir`` sent the default data directory's token (an
    earlier daemon's, at the same address) and said only ``401: ...``, naming no directory."""
    with serving(tmp_path) as (base, _auth, data):
        other = tmp_path / "other"  # the default data directory of a user who ran serve before
        other.mkdir()
        (other / "address").write_text(base)
        (other / "token").write_text("o" * 43)
        env = {"HOSTLER_HOME": str(other), "HOSTLER_TOKEN": ""}
        refused = run_cli("unload", "llamacpp:alpha:0", "--url", base, env=env)
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith("hostler: error [daemon.refused]: ")
        assert "/api/engines/llamacpp:alpha:0/unload: 401: " in refused.stderr
        # its address names this daemon, which does not hold its token (a stale address file):
        # the token is not sent at all (issue 21: it went to whoever took the port)
        assert (
            f"(sent no token: the hostler serve at {base} does not hold {other}'s token"
            in refused.stderr
        )
        assert "--data-dir DIR" in refused.stderr and "--token or $HOSTLER_TOKEN" in refused.stderr
        # none sent: the default directory's daemon listens elsewhere
        (other / "address").write_text("http://127.0.0.1:1")
        unsent = run_cli("unload", "llamacpp:alpha:0", "--url", base, env=env)
        assert unsent.returncode == 1
        assert f"(sent no token: {other}'s daemon listens at http://127.0.0.1:1)" in unsent.stderr
        # the fix the message names works
        fixed = run_cli(
            "unload", "llamacpp:alpha:0", "--url", base, "--data-dir", str(data), env=env
        )
        assert fixed.returncode == 0, fixed.stderr
        assert fixed.stdout == "llamacpp:alpha:0: was not loaded\n"
