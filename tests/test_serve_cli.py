"""``hostler serve`` as a real process: the daemon with its HTTP face, real engines, real HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hostler.config import discovered_config
from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import kill_leftovers, served_port, start_daemon, token_holders
from _support import run_cli

pytestmark = pytest.mark.slow


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
        no_token = run_cli("unload", "llamacpp:beta:0", "--url", base, "--token", "wrong")
        assert no_token.returncode == 1 and "401" in no_token.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        kill_leftovers(data)
    assert token_holders(prefix_of(data)) == []


def test_serve_refuses_a_bad_port_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    server = start_daemon(
        write_config(tmp_path), data, log, command="serve", extra=("--port", "70000")
    )
    assert server.wait(60) == 2
    assert "a port from 0 to 65535, not '70000'" in log.read_text()


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
    config = discovered_config(tmp_path)
    assert config.data_dir == tmp_path.resolve()
    assert sorted(e.key for e in config.engines) == [
        "llamacpp:a:0",
        "llamacpp:big-00001-of-00002:0",
        "llamacpp:smollm2-135m.q4:0",
    ]
    assert all(not e.autostart and e.model.is_absolute() for e in config.engines)
    assert discovered_config(tmp_path / "empty").engines == ()


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
