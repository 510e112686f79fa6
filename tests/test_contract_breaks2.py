"""Breaks of the plugin contract found by the second hostile round (RD1, PG1, conformance).

Each test states the promised behaviour and fails today for the reason its docstring names.
Real processes and real sockets where it matters: nothing is mocked.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import test_contract as contract
from hostler.errors import PluginError
from hostler.plugin import Progress, ReadinessProbe
from hostler.testing import conformance
from test_contract_breaks import start_adapter


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


def test_a_progress_unit_with_control_characters_is_refused() -> None:
    """Progress.unit is shown raw by `hostler ps`: one with control characters is refused.

    PG1: a bar that is out of range is no progress, and `hostler ps` prints
    ``state done/total unit``. Today Progress.__post_init__ checks only the unit's length,
    so a unit read from an engine's line (``"\\x1b[2J"``, ``"step\\n"``) reaches the
    operator's terminal through hostler.cli.ps._state, clearing the screen or breaking the
    table, where request_model, option names and the rest are held to isprintable().
    """
    for unit in ("\x1b[2J", "step\n", "\r\x07"):
        with pytest.raises(ValueError, match=r"(?i)unit"):
            Progress(1, 2, unit)


UDP_ENGINE = """
import socket, time
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("0.0.0.0", 0))
print("bound", flush=True)
time.sleep(60)
"""


def test_the_loopback_check_sees_a_udp_socket_bound_to_every_interface(tmp_path: Path) -> None:
    """An engine with a UDP socket on 0.0.0.0 is reachable beyond loopback: the suite says so.

    The conformance suite's live check promises that the engine binds 127.0.0.1 only. Today
    hostler.testing.conformance._listening_beyond_loopback keeps only sockets whose status is
    LISTEN, which a UDP socket never has (psutil reports CONN_NONE), so an engine that takes
    datagrams from the whole network passes.
    """
    script = tmp_path / "udp_engine.py"
    script.write_text(UDP_ENGINE)
    engine = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout is not None and engine.stdout.readline().strip() == "bound"
        time.sleep(0.1)
        wide = conformance._listening_beyond_loopback([engine.pid])
        assert wide, "a UDP socket on 0.0.0.0 was not reported"
    finally:
        engine.kill()
        engine.wait()
        if engine.stdout is not None:
            engine.stdout.close()


def test_a_models_extra_args_win_per_flag_however_the_key_is_spelled(tmp_path: Path) -> None:
    """RD5: the model's extra_args win per key over engine_defaults', `no-mmap` being `--no-mmap`.

    A key without dashes gets `--`, so `no-mmap` and `--no-mmap` name the same flag. Today
    hostler.config._engines_of merges the two tables by the key as written, so a model's
    `no-mmap = false` (leave the flag out) sits beside the defaults' `"--no-mmap" = true` and
    the engine is still launched with `--no-mmap`: the model's setting silently loses.
    """
    from hostler.config import load_config
    from hostler.plugin import extra_args_argv

    (tmp_path / "m.gguf").write_bytes(b"weights")
    config = tmp_path / "hostler.toml"
    config.write_text(
        "[engine_defaults.llamacpp]\n"
        'extra_args = { "--no-mmap" = true }\n\n'
        "[[models]]\n"
        'id = "m"\n'
        'path = "m.gguf"\n'
        'extra_args = { "no-mmap" = false }\n'
    )
    engine = load_config(config, data_dir=tmp_path / "data").engines[0]
    assert "--no-mmap" not in extra_args_argv(engine.extra_args), engine.extra_args
