"""The daemon as a real process: restart = replay + reconcile (adopt, lose, reap)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from hostler import EventStore
from hostler.drivers.host_ledger import catch_up
from hostler.engines.reconcile import DAEMON_STREAM
from hostler.engines.supervisor import free_port
from hostler.testing.tiny_gguf import TinyModel, write_tiny_llama
from hostler_llamacpp.binary import find_llama_server

from _daemons import (
    alive,
    chat,
    count,
    daemon_starts,
    engines,
    events,
    kill_leftovers,
    start_daemon,
    wait_for,
)
from _support import REPO

KEYS = ("llamacpp:alpha:0", "llamacpp:beta:0")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "alpha.gguf", TinyModel(seed=1))
    write_tiny_llama(models / "beta.gguf", TinyModel(seed=2))
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nhealth_interval = 5\nledger = "ledger.db"\n'
        + "".join(
            f'\n[[engines]]\nkey = "{key}"\nmodel = "models/{key.split(":")[1]}.gguf"\nctx = 512\n'
            for key in KEYS
        )
    )
    data = tmp_path / "data"
    yield config, data
    kill_leftovers(data)  # nothing of this data directory may be left running, whatever happened


def test_a_killed_daemons_engines_are_adopted_without_reload(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    config, data = setup
    first = start_daemon(config, data, tmp_path / "daemon1.log")
    try:
        wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
        before = engines(data)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        assert all(alive(pid) for _, pid, _ in before.values()), "engines must outlive the daemon"
        second = start_daemon(config, data, tmp_path / "daemon2.log")
        try:
            wait_for(lambda: len(daemon_starts(data)) == 2)
            started = daemon_starts(data)[-1]
            assert sorted(started["adopted"]) == sorted(KEYS)
            assert started["lost"] == [] and started["reaped"] == []
            after = engines(data)
            for key in KEYS:
                assert after[key][0] == "running"
                assert after[key][1] == before[key][1]  # same pid: adopted, not reloaded
                assert count(data, key, "engine.spawned") == 1
                assert count(data, key, "engine.adopted") == 1
                assert chat(after[key][2])  # type: ignore[arg-type]
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(30)
        for key in KEYS:
            assert not alive(before[key][1]), "a clean shutdown stops the engines"
            assert engines(data)[key][0] == "stopped"
        assert any(t == "daemon.stopped" for _, t, _ in events(data, DAEMON_STREAM))
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()


def test_an_engine_started_with_older_flags_is_adopted_with_them(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    """A flag added to the config while the daemon was down reaches the engine at its next start.

    Adoption compares the live command line with the argv recorded at its spawn, never with the
    argv the config gives today: the engine is adopted (same pid, warm) with its old flags, as
    docs/plugins/reference.md says (it once said such an engine was started again).
    """
    config, data = setup
    first = start_daemon(config, data, tmp_path / "daemon1.log")
    try:
        wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
        before = engines(data)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    config.write_text(
        config.read_text() + "\n[engine_defaults.llamacpp]\nextra_args = { threads = 1 }\n"
    )
    second = start_daemon(config, data, tmp_path / "daemon2.log")
    try:
        wait_for(lambda: len(daemon_starts(data)) == 2)
        assert sorted(daemon_starts(data)[-1]["adopted"]) == sorted(KEYS)
        for key in KEYS:
            pid = before[key][1]
            assert engines(data)[key][1] == pid  # the same process, not started again
            assert "--threads" not in psutil.Process(pid).cmdline()  # its flags of then
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)
    third = start_daemon(config, data, tmp_path / "daemon3.log")
    try:
        wait_for(lambda: all(count(data, k, "engine.ready") == 2 for k in KEYS))
        for key in KEYS:
            argv = psutil.Process(engines(data)[key][1]).cmdline()
            assert argv[argv.index("--threads") + 1] == "1"  # the next start has the new flag
    finally:
        third.send_signal(signal.SIGTERM)
        third.wait(30)


def test_an_engine_killed_while_the_daemon_was_down_is_lost_and_released(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    config, data = setup
    first = start_daemon(config, data, tmp_path / "daemon1.log")
    wait_for(lambda: all(count(data, k, "engine.ready") == 1 for k in KEYS))
    before = engines(data)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    victim, survivor = KEYS
    os.kill(before[victim][1], signal.SIGKILL)  # type: ignore[arg-type]
    wait_for(lambda: not alive(before[victim][1]))
    second = start_daemon(config, data, tmp_path / "daemon2.log")
    try:
        wait_for(lambda: len(daemon_starts(data)) == 2)
        started = daemon_starts(data)[-1]
        assert started["lost"] == [victim]
        assert started["adopted"] == [survivor]
        lost = [p for s, t, p in events(data) if s == f"engine/{victim}" and t == "engine.lost"]
        assert lost and "exited" in lost[0]["cause"]
        with EventStore.open(tmp_path / "ledger.db") as ledger:
            released = [r.payload for r in ledger.read_all() if r.type == "ledger.released"]
        assert any(r["key"] == victim for r in released)
        # the lost engine is autostarted again by the new daemon (a fresh spawn)
        wait_for(lambda: count(data, victim, "engine.ready") == 2)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)


def test_a_stray_with_our_token_is_reaped_and_a_stranger_is_never_touched(
    setup: tuple[Path, Path], tmp_path: Path
) -> None:
    config, data = setup
    data.mkdir(parents=True)
    (data / "daemon-id").write_text("hostler-teststray\n")
    model = tmp_path / "models" / "alpha.gguf"
    binary = str(find_llama_server())

    def launch(env_token: str | None) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.pop("HOSTLER_LAUNCH_TOKEN", None)
        if env_token:
            env["HOSTLER_LAUNCH_TOKEN"] = env_token
        return subprocess.Popen(
            [
                binary,
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "-c",
                "256",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )

    stray = launch("hostler-teststray:leftover")
    stranger = launch(None)  # the same binary and model, but not ours
    other_daemons = launch("hostler-someoneelse:abc")  # another data directory's engine
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    try:
        wait_for(lambda: len(daemon_starts(data)) == 1)
        assert daemon_starts(data)[0]["reaped"] == [stray.pid]
        wait_for(lambda: stray.poll() is not None)
        assert stranger.poll() is None
        assert other_daemons.poll() is None
        reaped = [p for _, t, p in events(data, DAEMON_STREAM) if t == "daemon.reaped"]
        assert reaped[0]["launch_token"] == "hostler-teststray:leftover"
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        for proc in (stray, stranger, other_daemons):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_bad_engine_is_recorded_and_the_daemon_stays_up(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "good.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        '\n[[engines]]\nkey = "llamacpp:missing:0"\nmodel = "nope.gguf"\nctx = 512\n'
        '\n[[engines]]\nkey = "llamacpp:good:0"\nmodel = "good.gguf"\nctx = 512\n'
    )
    data = tmp_path / "data"
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    try:
        wait_for(lambda: count(data, "llamacpp:good:0", "engine.ready") == 1)
        failed = [
            p
            for s, t, p in events(data)
            if s == "engine/llamacpp:missing:0" and t == "engine.failed"
        ]
        assert failed
        assert failed[0]["error"] == f"{tmp_path / 'nope.gguf'}: no such model file"
        assert daemon.poll() is None  # still up
        samples = [p for _, t, p in events(data, "device/host") if t == "device.sampled"]
        assert len(samples) == 1  # the observation the budget came from
        assert samples[0]["system_ram"] > 0
        log = (tmp_path / "daemon.log").read_text()
        assert "nope.gguf: no such model file" in log
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        assert daemon.returncode == 0


def test_config_errors_are_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[[engines]]\nkey = "not a key"\nmodel = "x.gguf"\n')
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from hostler.cli import main; sys.exit(main())",
            "daemon",
            "--config",
            str(config),
            "--data-dir",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO / "tests",
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"hostler: error [usage.invalid]: {config}: engines[0].key: must look like "
        "engine:model:replica (got 'not a key')"
    )


_BUGGY_PLUGIN = """
from hostler.plugin import hookimpl
from hostler_llamacpp import LlamaCppAdapter


class Buggy(LlamaCppAdapter):
    engine_type = "buggy"

    def build_command(self, spec):
        raise KeyError("n_gpu_layers")


@hookimpl
def register_engines(register):
    register(Buggy)
"""


def test_a_plugin_that_raises_at_run_time_fails_its_engine_and_the_daemon_stays_up(
    tmp_path: Path,
) -> None:
    """Break 5: a KeyError in build_command escaped _autostart and took the daemon down."""
    site = tmp_path / "site"
    (site / "hostler_test_buggy").mkdir(parents=True)
    (site / "hostler_test_buggy" / "__init__.py").write_text(_BUGGY_PLUGIN)
    dist = site / "hostler_test_buggy-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hostler-test-buggy\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text("[hostler]\nbuggy = hostler_test_buggy\n")
    write_tiny_llama(tmp_path / "good.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        '\n[[engines]]\nkey = "buggy:good:0"\nmodel = "good.gguf"\nctx = 512\n'
        '\n[[engines]]\nkey = "llamacpp:good:0"\nmodel = "good.gguf"\nctx = 512\n'
    )
    data = tmp_path / "data"
    daemon = start_daemon(config, data, tmp_path / "daemon.log", env={"PYTHONPATH": str(site)})
    try:
        wait_for(lambda: count(data, "llamacpp:good:0", "engine.ready") == 1)
        wait_for(lambda: count(data, "buggy:good:0", "engine.failed") == 1)
        failed = next(
            p for s, t, p in events(data) if s == "engine/buggy:good:0" and t == "engine.failed"
        )
        assert "'buggy' engine plugin (hostler_test_buggy.Buggy)" in failed["error"]
        # the first call that reached the plugin's bug: pricing asks build_command for the build
        assert "raised KeyError: 'n_gpu_layers' in " in failed["error"]
        assert engines(data)["buggy:good:0"][0] == "fatal"
        assert daemon.poll() is None  # still up, still serving the good engine
        assert chat(engines(data)["llamacpp:good:0"][2])  # type: ignore[arg-type]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    assert daemon.returncode == 0
    with EventStore.open(tmp_path / "ledger.db") as ledger:
        assert catch_up(ledger).committed == 0


def test_the_data_directory_and_engine_logs_are_private(tmp_path: Path) -> None:
    """The data directory was created 0755; run/, work/, engine.log, daemon-id world-readable."""
    write_tiny_llama(tmp_path / "good.gguf")
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        '\n[[engines]]\nkey = "llamacpp:good:0"\nmodel = "good.gguf"\nctx = 512\n'
    )
    data = tmp_path / "data"
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    try:
        wait_for(lambda: count(data, "llamacpp:good:0", "engine.ready") == 1)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    run = data / "run" / "llamacpp_good_0"
    modes = {
        path.relative_to(data).as_posix(): path.stat().st_mode & 0o777
        for path in (data, data / "daemon-id", data / "run", run, run / "work", run / "engine.log")
    }
    assert modes == {
        ".": 0o700,
        "daemon-id": 0o600,
        "run": 0o700,
        "run/llamacpp_good_0": 0o700,
        "run/llamacpp_good_0/work": 0o700,
        "run/llamacpp_good_0/engine.log": 0o600,
    }


def test_one_bad_engine_stays_one_bad_engine(tmp_path: Path) -> None:
    """A header with ``head_count_kv`` as strings took the daemon down, orphaning the good one.

    Now every failure while planning, pricing or starting (a hostile header, an option the
    engine refuses) fails that engine alone, recorded with its cause; the daemon and the good
    engine go on, and the ledger holds only what runs.
    """
    import gguf
    import numpy as np

    write_tiny_llama(tmp_path / "good.gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "hostile.gguf"), "llama")
    writer.add_block_count(2)
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_array("llama.attention.head_count_kv", ["a", "b"])
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = tmp_path / "hostler.toml"
    config.write_text(
        '[daemon]\nidle_timeout = 0\nledger = "ledger.db"\n'
        '\n[[engines]]\nkey = "llamacpp:hostile:0"\nmodel = "hostile.gguf"\nctx = 512\n'
        '\n[[engines]]\nkey = "llamacpp:flag:0"\nmodel = "good.gguf"\nctx = 512\n'
        'extra_args = { "no-such-flag" = 1 }\n'
        '\n[[engines]]\nkey = "llamacpp:good:0"\nmodel = "good.gguf"\nctx = 512\n'
    )
    data = tmp_path / "data"
    daemon = start_daemon(config, data, tmp_path / "daemon.log")
    try:
        wait_for(lambda: count(data, "llamacpp:good:0", "engine.ready") == 1)
        wait_for(lambda: count(data, "llamacpp:flag:0", "engine.crashed") == 1)
        wait_for(lambda: count(data, "llamacpp:hostile:0", "engine.failed") == 1)
        failed = {s: p for s, t, p in events(data) if t == "engine.failed"}
        # priced before anything runs: failed, with the key named
        assert failed["engine/llamacpp:hostile:0"]["error"] == (
            f"{tmp_path / 'hostile.gguf'}: llama.attention.head_count_kv: expected an integer "
            "or an array of integers, got an array of strings"
        )
        # spawned, and it exited before ready: a crash with the engine's own words (SP2: never
        # restarted by itself, only by the next request, within the restart budget)
        crash = next(
            p for s, t, p in events(data) if s == "engine/llamacpp:flag:0" and t == "engine.crashed"
        )
        assert crash["reached_ready"] is False
        assert "invalid argument: --no-such-flag" in crash["output_tail"]
        assert daemon.poll() is None
        assert engines(data)["llamacpp:good:0"][0] == "running"
        assert engines(data)["llamacpp:hostile:0"][0] == "fatal"
        assert engines(data)["llamacpp:flag:0"][0] == "backoff"
        assert engines(data)["llamacpp:hostile:0"][1] is None  # nothing was ever spawned
        with EventStore.open(tmp_path / "ledger.db") as store:
            held = catch_up(store).reservations
        assert sorted(h.key for h in held.values()) == ["llamacpp:good:0"]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    assert daemon.returncode == 0
    assert "Traceback" not in (tmp_path / "daemon.log").read_text()
    kill_leftovers(data)
