"""The CLI imports only the module of the command it runs (a fast start for ``hostler state``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hostler.cli import COMMANDS, build_parser, main


def _subcommands(parser: object) -> set[str]:
    actions = getattr(parser, "_subparsers")._group_actions  # noqa: B009 - argparse's own
    return set(actions[0].choices)


def test_every_listed_name_is_what_its_module_registers() -> None:
    everything = _subcommands(build_parser())
    assert everything == {name for _, _, names in COMMANDS for name in names}
    for _, _, names in COMMANDS:
        for name in names:
            assert _subcommands(build_parser(name)) == set(names)
    assert {"state", "explain", "replay", "whatif", "timeline", "export", "import"} <= everything


def test_an_unknown_or_missing_command_gets_the_whole_list(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["nosuch"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hostler: error [usage.invalid]: hostler: argument COMMAND: invalid")
    assert "'state'" in err and "'timeline'" in err
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("hostler ")


def test_state_does_not_import_the_http_face_plotting_or_alembic() -> None:
    probe = (
        "import sys; from hostler.cli import build_parser; build_parser('state'); "
        "print(sorted(m for m in ('starlette', 'matplotlib', 'httpx', 'alembic') "
        "if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_commands_that_read_no_model_file_do_not_import_numpy() -> None:
    """Was: the config's key parser imported ``hostler.capacity``, whose GGUF reader loads
    numpy and gguf: about 0.3 s (more on a busy machine) of every ``events``, ``ps``,
    ``whatif``, ``explain`` and daemon start, and of each test that runs them as a process."""
    probe = (
        "import sys; from hostler.cli import build_parser; "
        "[build_parser(c) for c in ('events', 'state', 'ps', 'models', 'load', 'explain', "
        "'replay', 'whatif', 'timeline', 'export')]; import hostler.config, hostler.plugin; "
        "print(sorted(m for m in ('numpy', 'gguf', 'hostler.capacity.gguf_header') "
        "if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    # the reader is still there when asked for, by the package and by the adapter contract
    asked = (
        "import sys; from hostler.capacity import read_geometry; "
        "from hostler.capacity.gguf_header import read_geometry as direct; "
        "print(read_geometry is direct, 'numpy' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", asked], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True True"
    import hostler.capacity

    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        _ = hostler.capacity.nosuch
