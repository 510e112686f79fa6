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
