"""The CLI's shared options and argument types, for the parsers (nothing heavy imported).

Every ``add_parser`` of :mod:`hostler.cli.parsers` builds its options from these: ``hostler
--help`` and each command's ``--help`` import this module, argparse and little else.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import urlsplit

from hostler.address import DEFAULT_URL
from hostler.fleet import host_name_problem
from hostler.paths import masked, user_path

__all__ = [
    "DEFAULT_URL",
    "TOKEN_VARIABLE",
    "URL_VARIABLE",
    "add_client_options",
    "add_log_options",
    "add_log_source",
    "add_wide_option",
    "budget_argument",
    "bytes_argument",
    "check_url",
    "data_directory",
    "host_argument",
    "log_argument",
    "path_argument",
    "port_number",
    "spillover_argument",
    "switch_argument",
    "url_argument",
]

#: The environment variable that names the daemon when ``--url`` is not given.
URL_VARIABLE = "HOSTLER_URL"
#: The environment variable that holds the daemon's token when ``--token`` is not given.
TOKEN_VARIABLE = "HOSTLER_TOKEN"  # noqa: S105 - a variable name, not a secret
_MAX_URL = 2048
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)
_MAX_BYTES = 2**60

#: Longer than any path a kernel accepts (PATH_MAX is 4096 on Linux).
_MAX_PATH = 4096


def _given_path(text: str, *, resolve: bool = False) -> Path:
    """``text`` as :func:`hostler.paths.user_path` makes it, or argparse's one-line refusal."""
    if not text or len(text) > _MAX_PATH:
        raise argparse.ArgumentTypeError(f"{masked(text)[:40]!r} is not a usable path")
    try:
        return user_path(text, resolve=resolve)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{masked(text)[:200]!r}: {exc}") from None


def path_argument(text: str) -> Path:
    """An argparse type: a file path as given, ``~`` and ``~user`` expanded.

    Refused in one line (usage error, exit 2) when it cannot be expanded or holds a NUL.
    """
    return _given_path(text)


def log_argument(text: str) -> str:
    """An argparse type for ``--db``: a URL as given, a file path expanded and resolved.

    A path that cannot be (a ``~user`` nobody knows, a symbolic link loop) is refused in one
    line; a URL is checked when the log is opened.
    """
    if not text or "://" in text:
        return text
    return str(_given_path(text, resolve=True))


def data_directory(text: str) -> Path:
    """An argparse type: a data directory, resolved (engines run in other working directories).

    Refused in one line when it cannot be expanded or resolved, or names something that is not
    a directory.
    """
    if not text or len(text) > _MAX_PATH or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a usable directory path")
    path = _given_path(text, resolve=True)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: exists and is not a directory")
    return path


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """``--db`` and ``--data-dir``, shared by every command that reads a log."""
    parser.add_argument(
        "--db",
        type=log_argument,
        help="event log file or SQLAlchemy URL (default: DATA_DIR/events.db)",
    )
    parser.add_argument(
        "--data-dir",
        type=data_directory,
        help="data directory (default: $HOSTLER_HOME or ~/.local/share/hostler)",
    )
    parser.add_argument(
        "--host-name",
        type=host_name_argument,
        help="a fleet host's part of a database log (default: every host; docs/fleet.md)",
    )


def host_name_argument(text: str) -> str:
    """An argparse type: a fleet host's name (:func:`hostler.fleet.host_name_problem`)."""
    problem = host_name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def add_log_source(parser: argparse.ArgumentParser) -> None:
    """An optional ``LOG`` argument beside ``--db`` and ``--data-dir`` (the post-mortem commands).

    :func:`take_log_argument` folds it into ``--db``; giving both is refused.
    """
    parser.add_argument(
        "log",
        nargs="?",
        type=log_argument,
        metavar="LOG",
        help="event log file or SQLAlchemy URL, as --db (default: DATA_DIR/events.db)",
    )
    add_log_options(parser)


def check_url(text: str) -> str:
    """``text`` as a daemon address (``http(s)://host[:port][/prefix]``, no trailing slash).

    Raises:
        ValueError: It is not one; the message says what is expected.
    """
    if not text or len(text) > _MAX_URL or any(c.isspace() for c in text):
        raise ValueError(f"{text[:60]!r} is not a daemon URL (http://HOST:PORT)")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not a daemon URL (http://HOST:PORT)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise ValueError(f"{text[:60]!r} is not a daemon URL (http://HOST:PORT)")
    del port  # parsed only to refuse a bad one
    return text.rstrip("/")


def url_argument(text: str) -> str:
    """An argparse type: a daemon URL (see :func:`check_url`), refused in one line otherwise."""
    try:
        return check_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_settings_options(parser: argparse.ArgumentParser, config_help: str) -> None:
    """``--config`` and ``--data-dir``: the settings ``hostler serve`` / ``daemon`` would use."""
    parser.add_argument("--config", type=path_argument, help=config_help)
    parser.add_argument(
        "--data-dir",
        type=data_directory,
        help="data directory (over the config's; default $HOSTLER_HOME, else "
        "~/.local/share/hostler)",
    )


def add_client_options(
    parser: argparse.ArgumentParser, *, json_flag: bool = True, url_help: str | None = None
) -> None:
    """``--url``, ``--token``, ``--data-dir`` (where the token file is), and ``--json``."""
    parser.add_argument(
        "--url",
        type=url_argument,
        help=url_help
        or f"where hostler serve listens (default ${URL_VARIABLE}, else where the data "
        f"directory's serve said it listens, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token",
        help=f"the daemon's token (default ${TOKEN_VARIABLE}, else --data-dir's 'token' file)",
    )
    parser.add_argument(
        "--data-dir", type=data_directory, help="the daemon's data directory (for its token)"
    )
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def add_wide_option(parser: argparse.ArgumentParser) -> None:
    """``--wide``: a table with every column, whatever the terminal's width."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="show every column (by default a table fits the terminal, or $COLUMNS)",
    )


def port_number(text: str) -> int:
    """A TCP port from 0 to 65535."""
    if not text.isdigit() or len(text) > 5 or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"a port from 0 to 65535, not {text[:20]!r}")
    return int(text)


def host_argument(text: str) -> str:
    """An address or host name to listen on: printable ASCII, no space, no path."""
    if not 0 < len(text) <= 253 or not text.isascii() or not text.isprintable() or " " in text:
        raise argparse.ArgumentTypeError(f"an address to listen on, not {text[:60]!r}")
    if "/" in text:
        raise argparse.ArgumentTypeError(f"an address (no scheme, no path), not {text[:60]!r}")
    return text


def bytes_argument(text: str) -> int | str:
    """An argparse type: ``auto`` (kept as the word), or bytes.

    ``8589934592``, ``8G``, ``8 GiB``, ``512MiB``: units are binary (``G`` = GiB); refused
    in one line otherwise or past 2^60.
    """
    cleaned = text.strip()
    if cleaned.lower() == "auto":
        return "auto"
    match = _SIZE.fullmatch(cleaned) if len(cleaned) <= 40 else None
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a size: give bytes (8589934592), a size (8G, 512MiB) or auto"
        )
    number, unit = match.group(1), _UNITS[match.group(2).lower()]
    value = round(float(number) * unit) if "." in number else int(number) * unit
    if value > _MAX_BYTES:
        raise argparse.ArgumentTypeError(f"{text[:40]} is over 2^60 bytes")
    return value


def spillover_argument(text: str) -> bool | str:
    """An argparse type: ``on`` (True), ``off`` (False) or ``auto`` (kept as the word)."""
    choices: dict[str, bool | str] = {"on": True, "off": False, "auto": "auto"}
    key = text.strip().lower()
    if key not in choices:
        raise argparse.ArgumentTypeError(f"spillover is on, off or auto, not {text[:20]!r}")
    return choices[key]


def budget_argument(text: str) -> int:
    """An argparse type: a budget in bytes (``24GiB``, ``512MiB``, ``8589934592``); not ``auto``."""
    value = bytes_argument(text)
    if not isinstance(value, int):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a size: give bytes (8589934592) or a size (24GiB, 512MiB)"
        )
    return value


def switch_argument(text: str) -> bool:
    """An argparse type: ``on`` (True) or ``off`` (False)."""
    choices = {"on": True, "off": False}
    key = text.strip().lower()
    if key not in choices:
        raise argparse.ArgumentTypeError(f"spillover is on or off, not {text[:20]!r}")
    return choices[key]
