"""Where hostler keeps its files by default, and paths given from outside (driver layer).

Every path a person hands hostler's core — a config key, a command-line argument, an environment
variable — goes through :func:`user_path`, so that a ``~user`` nobody knows, a symbolic link
loop or a NUL is one line naming what was given and where, never a traceback.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from hostler.errors import HostlerError, SettingError, StorePathError

__all__ = [
    "default_data_dir",
    "default_log_path",
    "env_log",
    "env_path",
    "home_dir",
    "masked",
    "private_dir",
    "private_file",
    "user_path",
]

EVENTS_FILE = "events.db"


#: Linux's NAME_MAX and PATH_MAX: longer names fail every system call with ENAMETOOLONG.
_NAME_MAX = 255
_PATH_MAX = 4096


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_USER_PASSWORD = re.compile(r"(://[^/@:?#]*:)[^/@?#]*@")
_QUERY_SECRET = re.compile(r"([?&](?:password|sslpassword)=)[^&#]*", re.IGNORECASE)


def masked(text: str) -> str:
    """``text`` as a message may echo it: a URL's password (``user:PW@``, ``?password=``) hidden."""
    if not _URL.match(text):
        return text
    return _QUERY_SECRET.sub(r"\1***", _USER_PASSWORD.sub(r"\1***@", text))


def user_path(
    text: str | os.PathLike[str],
    *,
    base: Path | None = None,
    resolve: bool = False,
    follow_links: bool = True,
) -> Path:
    """A path given from outside, as hostler will use it.

    ``~`` and ``~user`` are expanded. A relative path is taken against ``base`` when one is
    given, and then resolved (symbolic links followed); with ``resolve`` every path is resolved
    (a relative one against the working directory). Otherwise the path is kept as written.
    Without ``follow_links`` a relative path is only joined to ``base``: a program's path keeps
    the link it names (a virtual environment's ``bin/python`` is that venv's interpreter only
    when started by that path).

    Raises:
        ValueError: One line saying why the path is unusable (a ``~user`` with no known home
            directory, a symbolic link loop, a NUL character, a working directory that is
            gone, a URL). Callers name where the path came from.
    """
    raw = os.fspath(text)
    if "\0" in raw:
        raise ValueError("a path cannot hold a NUL character")
    if _URL.match(raw):  # taken as a relative path, it once made folders named after a URL
        raise ValueError(
            f"a file path, not a URL ({raw.split('://', 1)[0][:40]}://...): this names a file "
            "or folder of this host"
        )
    if len(raw) > _PATH_MAX or any(len(part) > _NAME_MAX for part in Path(raw).parts):
        raise ValueError(
            f"too long for a path (at most {_NAME_MAX} characters a name, {_PATH_MAX} in all)"
        )
    try:
        path = Path(raw).expanduser()
    except RuntimeError:  # no such user, or no HOME and no password entry for "~"
        user = raw.split(os.sep, maxsplit=1)[0]
        raise ValueError(f"no home directory known for {user!r}") from None
    if base is not None and not path.is_absolute():
        path, resolve = base / path, follow_links
    if not resolve:
        return path
    try:
        return path.resolve()
    except RuntimeError:  # Python 3.11 and 3.12 report a symbolic link loop this way
        raise ValueError(f"cannot be resolved ({os.strerror(errno.ELOOP)})") from None
    except OSError as exc:  # a loop on newer Pythons, a working directory that is gone
        raise ValueError(f"cannot be resolved ({exc.strerror or exc})") from None


def env_path(name: str, *, resolve: bool = False) -> Path | None:
    """The path an environment variable names (see :func:`user_path`); None when unset or blank.

    Raises:
        SettingError: The variable names a path that cannot be used (the variable and why).
    """
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        return user_path(text, resolve=resolve)
    except ValueError as exc:
        raise SettingError(
            f"{name}={masked(text)[:200]!r}: {exc}; fix the path or unset the variable"
        ) from None


def env_log(value: str) -> str | None:
    """``HOSTLER_DB`` as every command and the daemon read it; None when blank.

    A database URL (its kind checked) or a file path (expanded, resolved).

    Raises:
        SettingError: Neither, in one line naming the variable.
    """
    text = value.strip()
    if not text:
        return None
    if "://" in text:
        # sqlalchemy only when a URL is given (the CLI starts without it)
        from hostler.store.connect import check_server_url  # noqa: PLC0415

        try:
            check_server_url(text)
        except HostlerError as exc:
            raise SettingError(f"HOSTLER_DB: {exc.message}") from None
        return text
    try:
        return str(user_path(text, resolve=True))
    except ValueError as exc:
        raise SettingError(
            f"HOSTLER_DB={masked(text)[:200]!r}: {exc}; fix the path or unset the variable"
        ) from None


def home_dir() -> Path:
    """This user's home directory.

    Raises:
        SettingError: ``HOME`` is unset and the password database knows no home for this user.
    """
    try:
        return Path.home()
    except RuntimeError:
        raise SettingError(
            "HOME is unset and this user has no home directory in the password database; "
            "set HOME (or HOSTLER_HOME for the data directory)"
        ) from None


def default_data_dir() -> Path:
    """``$HOSTLER_HOME``, else ``$XDG_DATA_HOME/hostler``, else ``~/.local/share/hostler``.

    Resolved (absolute, symbolic links followed).

    Raises:
        SettingError: The variable it came from names an unusable path.
    """
    home = env_path("HOSTLER_HOME", resolve=True)
    if home is not None:
        return home
    xdg = env_path("XDG_DATA_HOME")
    source = "XDG_DATA_HOME" if xdg is not None else "HOME"
    try:
        return user_path((xdg or home_dir() / ".local" / "share") / "hostler", resolve=True)
    except ValueError as exc:
        shown = os.environ.get(source, "")[:200]
        raise SettingError(
            f"{source}={shown!r}: {exc}; fix the path or unset the variable"
        ) from None


def default_log_path(data_dir: Path | None = None) -> Path:
    """The event log file inside a data directory."""
    return (data_dir or default_data_dir()) / EVENTS_FILE


def private_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) for this user only (0700); tighten one we own.

    Engine logs, work directories and launch tokens are nobody else's business.

    Raises:
        StorePathError: ``FOLDER: cannot create directory (REASON)``, naming the folder the
            system refused (a file in the way, a read-only or virtual file system, no right).
    """
    folder = path
    try:
        missing = [path, *(parent for parent in path.parents if not parent.exists())]
        for folder in reversed([p for p in missing if not p.exists()]):
            folder.mkdir(exist_ok=True, mode=0o700)  # every folder it creates, not just the last
        folder = path
        info = path.stat()
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:
            path.chmod(0o700)
    except OSError as exc:
        raise StorePathError(f"{folder}: cannot create directory ({exc.strerror or exc})") from None
    return path


def private_file(path: Path, text: str) -> None:
    """Write ``text`` to a new file only this user can read (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
