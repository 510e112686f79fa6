"""The client commands' one way to talk to a running ``hostler serve``: address, token, calls.

Every failure is one line: nothing answering is ``daemon.unreachable``; an answer that is an
error (401 for a wrong token, 404 for an unknown model...) carries the daemon's own message.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec
from urllib.parse import urlsplit

import httpx

from hostler.cli.common import data_directory
from hostler.errors import DaemonRefusedError, DaemonUnreachableError, SettingError
from hostler.paths import default_data_dir
from hostler.settings_env import valid_token

__all__ = [
    "DEFAULT_URL",
    "URL_VARIABLE",
    "add_client_options",
    "call",
    "check_url",
    "checks_answers",
    "daemon_url",
    "event_stream",
    "fetch",
    "post",
    "token_of",
    "url_argument",
]

DEFAULT_URL = "http://127.0.0.1:11435"
#: The environment variable that names the daemon when ``--url`` is not given.
URL_VARIABLE = "HOSTLER_URL"
TOKEN_VARIABLE = "HOSTLER_TOKEN"  # noqa: S105 - a variable name, not a secret
_MAX_URL = 2048


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


def daemon_url(args: argparse.Namespace, *, default: str | None = DEFAULT_URL) -> str | None:
    """The daemon a command talks to: ``--url``, else ``$HOSTLER_URL``, else ``default``.

    Raises:
        SettingError: ``$HOSTLER_URL`` is set and is not a URL.
    """
    given: str | None = getattr(args, "url", None)
    if given:
        return given
    value = os.environ.get(URL_VARIABLE, "")
    if value:
        try:
            return check_url(value)
        except ValueError as exc:
            raise SettingError(f"{URL_VARIABLE}: {exc}") from None
    return default


def add_client_options(
    parser: argparse.ArgumentParser, *, json_flag: bool = True, url_help: str | None = None
) -> None:
    """``--url``, ``--token``, ``--data-dir`` (where the token file is), and ``--json``."""
    parser.add_argument(
        "--url",
        type=url_argument,
        help=url_help
        or f"where hostler serve listens (default ${URL_VARIABLE}, else {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token", help="the daemon's token (default: read from --data-dir's 'token' file)"
    )
    parser.add_argument(
        "--data-dir", type=data_directory, help="the daemon's data directory (for its token)"
    )
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def token_of(args: argparse.Namespace) -> str | None:
    """``--token``, else ``$HOSTLER_TOKEN`` (the daemon's own), else the ``token`` file, else None.

    The data directory's token file is sent only to the address its daemon listens on (the
    ``address`` file it writes at start): it is that daemon's secret, never handed to another
    URL (give ``--token`` for any other).

    Raises:
        SettingError: ``$HOSTLER_TOKEN`` is set and cannot be a token.
    """
    if getattr(args, "token", None):
        return str(args.token)
    named = os.environ.get(TOKEN_VARIABLE, "")
    if named:
        if not valid_token(named):  # never echoed: it is a secret
            raise SettingError(
                f"{TOKEN_VARIABLE}: not a token (32 to 256 printable characters, no space); "
                "fix it or unset the variable"
            )
        return named
    folder = getattr(args, "data_dir", None) or default_data_dir()
    try:
        served = (folder / "address").read_text(encoding="utf-8").strip()
        token = (folder / "token").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    url = daemon_url(args)
    if url is None or _endpoint(url) != _endpoint(served):
        return None  # the data directory's token goes to its own daemon only
    return token or None


def _endpoint(url: str) -> tuple[str, int | None] | None:
    """``url``'s host (lower-cased, ``localhost`` as ``127.0.0.1``) and port, to compare."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    return ("127.0.0.1" if host == "localhost" else host), port


P = ParamSpec("P")


def checks_answers(command: Callable[P, int]) -> Callable[P, int]:
    """``command`` (a client command), with a daemon answer of the wrong shape as one line.

    What a daemon answers is input from outside: something else on the port, or another
    version, may answer 200 with JSON the command cannot read. That is said in one line
    (``daemon.refused``), never a traceback.
    """

    @functools.wraps(command)
    def checked(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            return command(*args, **kwargs)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise DaemonRefusedError(
                f"the answer is not one hostler serve gives ({type(exc).__name__}: "
                f"{str(exc)[:80]}): is that address hostler serve, of this version?"
            ) from None

    return checked


def _headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _unreachable(url: str, exc: Exception) -> DaemonUnreachableError:
    return DaemonUnreachableError(
        f"no hostler serve answers at {url[:200]} ({type(exc).__name__}); start it with "
        "`hostler serve`, or give --url"
    )


def _refused(url: str, path: str, response: httpx.Response) -> DaemonRefusedError:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    return DaemonRefusedError(
        f"{url[:200]}{path}: {response.status_code}: {message}", response.status_code
    )


def call(
    method: str,
    url: str,
    path: str,
    token: str | None,
    *,
    body: Any = None,
    timeout: float = 10,
) -> Any:
    """One request to the daemon; its JSON answer.

    Raises:
        DaemonUnreachableError: Nothing answers there, or it answered with an error (the
            message carries the status and the daemon's own message).
    """
    content = None if body is None else json.dumps(body).encode()
    headers = _headers(token)
    if content is not None:
        headers["content-type"] = "application/json"
    try:
        response = httpx.request(
            method, url + path, headers=headers, content=content, timeout=timeout
        )
    except httpx.HTTPError as exc:
        raise _unreachable(url, exc) from None
    if response.status_code != 200:
        raise _refused(url, path, response)
    try:
        return response.json()
    except ValueError:
        raise DaemonUnreachableError(
            f"{url[:200]}{path}: the answer is not JSON; is that a hostler serve?"
        ) from None


def fetch(url: str, path: str, token: str | None = None) -> Any:
    """GET ``path`` from the daemon as JSON (see :func:`call`)."""
    return call("GET", url, path, token)


def post(url: str, path: str, token: str | None) -> Any:
    """POST ``path`` to the daemon (a load may take minutes); its JSON answer."""
    return call("POST", url, path, token, timeout=600)


def event_stream(
    url: str, after: int, token: str | None, *, idle: float | None = None
) -> Iterator[dict[str, Any]]:
    """The daemon's events after seq ``after``, as they are written (``GET /api/events``).

    Each is ``{"seq", "stream", "version", "type", "payload"}``. It ends only when no event
    came for ``idle`` seconds (None: never); resume from the last seq seen.

    Raises:
        DaemonUnreachableError: Nothing answers there, it refused, or the stream broke off.
    """
    path = f"/api/events?after={after}"
    timeout = httpx.Timeout(10.0, read=idle)
    try:
        with httpx.stream("GET", url + path, headers=_headers(token), timeout=timeout) as answer:
            if answer.status_code != 200:
                answer.read()
                raise _refused(url, path, answer)
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    yield json.loads(line[6:])
    except httpx.ReadTimeout:
        return  # quiet for ``idle`` seconds: the caller resumes, or stops
    except httpx.HTTPError as exc:
        raise _unreachable(url, exc) from None
