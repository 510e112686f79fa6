"""The daemon's log on a real PostgreSQL server: ``--db``, ``[daemon] log``, ``HOSTLER_DB``.

Once ``hostler serve --db URL`` was "unrecognized arguments", ``ledger``/``log`` URLs wrote a
SQLite file in folders named after the URL, and ``hostler demo --db URL`` did the same.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest

from hostler.testing.tiny_gguf import write_tiny_llama

from _daemons import ServeChild, kill_leftovers, served_port, start_daemon
from _support import run_cli


def _no_url_folders(root: Path) -> None:
    """Nothing under ``root`` is named after a URL (the old failure wrote such folders)."""
    named = [p for p in root.rglob("*") if "postgresql" in p.name or "psycopg" in p.name]
    assert named == []


@pytest.mark.slow
def test_serve_with_db_writes_its_log_into_postgresql(tmp_path: Path, pg_url: str) -> None:
    write_tiny_llama(tmp_path / "alpha.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n\n[[engines]]\n'
        'key = "llamacpp:alpha:0"\nmodel = "alpha.gguf"\nctx = 512\nautostart = false\n'
    )
    data = tmp_path / "data"
    out = tmp_path / "serve.log"
    extra = ("--port", "0", "--db", pg_url, "--host-name", "gpu1")
    server = start_daemon(config, data, out, command="serve", extra=extra)
    try:
        base = f"http://127.0.0.1:{served_port(out)}"
        body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        listed = run_cli(
            "events", "--db", pg_url, "--host-name", "gpu1", "--type", "engine.ready", "--json"
        )
        assert listed.returncode == 0, listed.stderr
        ready = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [r["stream_id"] for r in ready] == ["engine/llamacpp:alpha:0"]
        assert ready[0]["metadata"]["host"] == "gpu1"  # --host-name names this daemon's host
        second = run_cli(
            "serve", "--config", str(config), "--data-dir", str(tmp_path / "other"),
            "--port", "0", "--db", pg_url, "--host-name", "gpu1",
        )  # fmt: skip
        assert second.returncode == 1
        assert second.stderr.count("\n") == 1, second.stderr
        assert "[store.locked]" in second.stderr and "owned by another hostler daemon" in (
            second.stderr
        )
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        kill_leftovers(data)
    assert not (data / "events.db").exists()  # the log is the database's, not a file's
    _no_url_folders(tmp_path)
    state = run_cli("state", "--db", pg_url)
    assert state.returncode == 0 and "HOST gpu1" in state.stdout
    assert "llamacpp:alpha:0" in state.stdout


def test_a_config_and_the_environment_name_a_database_log(tmp_path: Path, pg_url: str) -> None:
    """``[daemon] log`` takes a URL (checked in one line); ``HOSTLER_DB`` overrides it and is
    every reading command's default (not the demo's: it never writes into a main log)."""
    from hostler.config import load_config

    config = tmp_path / "hostler.toml"
    config.write_text(f'[daemon]\nlog = "{pg_url}"\n')
    assert load_config(config).log_target == pg_url
    config.write_text('[daemon]\nlog = "events/main.db"\n')
    assert load_config(config).log_target == str(tmp_path / "events" / "main.db")
    config.write_text('[daemon]\nlog = "nosuchdb://x/y"\n')
    refused = run_cli("serve", "--config", str(config), "--port", "0")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "daemon.log" in refused.stderr and "no database kind 'nosuchdb'" in refused.stderr
    demo = run_cli("demo", "--scripted", "--db", pg_url, "--data-dir", str(tmp_path))
    assert demo.returncode == 0, demo.stderr
    hosted = run_cli(
        "demo", "--scripted", "--db", pg_url, "--host-name", "lab-1", "--data-dir", str(tmp_path)
    )
    assert hosted.returncode == 0, hosted.stderr  # its own part: the database's log is not it
    one = run_cli("events", "--db", pg_url, "--host-name", "lab-1", "--json")
    assert {json.loads(line)["metadata"]["host"] for line in one.stdout.splitlines()} == {"lab-1"}
    events = run_cli("events", "--json", env={"HOSTLER_DB": pg_url})
    assert events.returncode == 0 and len(events.stdout.splitlines()) > 5
    again = run_cli("demo", "--scripted", "--db", pg_url, "--data-dir", str(tmp_path))
    assert again.returncode == 1 and "the demo writes into an empty log only" in again.stderr
    _no_url_folders(tmp_path)


@pytest.mark.slow
def test_a_served_model_answers_with_the_log_on_postgresql_from_the_environment(
    tmp_path: Path, pg_url: str
) -> None:
    write_tiny_llama(tmp_path / "alpha.gguf")
    models = f'[[models]]\nid = "alpha"\npath = "{tmp_path / "alpha.gguf"}"\nctx = 512\n'
    serve = ServeChild(tmp_path, models, env={"HOSTLER_DB": pg_url})
    try:
        body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        answer = httpx.post(f"{serve.base}/v1/chat/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
    finally:
        serve.close()
        kill_leftovers(serve.data)
    explain = run_cli("explain", "alpha", "--db", pg_url)
    assert explain.returncode == 0, explain.stderr
    assert not (serve.data / "events.db").exists()


def test_a_password_in_a_url_is_never_printed(tmp_path: Path) -> None:
    """Neither in the user part nor as a query parameter (libpq takes ``?password=``)."""
    for url in (
        "postgresql+psycopg://alice:S3CRETPW@127.0.0.1:1/x",
        "postgresql+psycopg://alice@127.0.0.1:1/x?password=S3CRETPW",
        "postgresql+psycopg://alice@127.0.0.1:1/x?sslmode=disable&password=S3CRETPW",
    ):
        shown = run_cli("events", "--db", url)
        assert shown.returncode == 1 and "[store.unavailable]" in shown.stderr, shown.stderr
        assert "S3CRETPW" not in shown.stderr + shown.stdout
        assert "***" in shown.stderr


def test_a_url_where_a_path_is_meant_is_one_line_and_makes_nothing(
    tmp_path: Path, pg_url: str
) -> None:
    """A URL in HOSTLER_LEDGER, --ledger, --data-dir or HOSTLER_HOME was taken as a relative
    path: a SQLite ledger or a whole data directory appeared in folders named after it."""
    home = {"HOSTLER_HOME": str(tmp_path / "home")}
    pg_url = pg_url.replace("postgres@", "postgres:PWLEAK@")  # never to be printed
    config = tmp_path / "bad.toml"
    config.write_text(f'[daemon]\ndata_dir = "{pg_url}"\n')
    for argv, env, name in (
        (["serve", "--port", "0", "--config", str(config)], {}, "daemon.data_dir"),
        (["import", pg_url, "--db", str(tmp_path / "i.db")], {}, pg_url.split("@")[1][:10]),
        (["serve", "--port", "0"], {"HOSTLER_MODELS_DIR": pg_url}, "HOSTLER_MODELS_DIR"),
        (
            ["serve", "--port", "0", "--db", str(tmp_path / "log.db")],
            {"HOSTLER_LEDGER": pg_url},
            "HOSTLER_LEDGER",
        ),
        (["budget", "--ledger", pg_url], {}, "--ledger"),
        (["serve", "--port", "0", "--data-dir", pg_url], {}, "--data-dir"),
        (["serve", "--port", "0"], {"HOSTLER_HOME": pg_url}, "HOSTLER_HOME"),
    ):
        refused = run_cli(*argv, env={**home, **env}, cwd=tmp_path)
        assert refused.returncode in (1, 2), (name, refused.stderr)
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert "PWLEAK" not in refused.stderr, refused.stderr
        assert name in refused.stderr
    _no_url_folders(tmp_path)
