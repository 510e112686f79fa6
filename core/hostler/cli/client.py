"""The client commands' one way to talk to a running ``hostler serve``: address, token, calls.

Every failure is one line: nothing answering is ``daemon.unreachable``; an answer that is an
error (401 for a wrong token, 404 for an unknown model...) carries the daemon's own message, and
a 401 also says which token was sent, from where, and how to send the right one.

HTTP is the standard library's (:mod:`http.client`): ``hostler ps`` starts in a few hundredths
of a second, with no HTTP library to import.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec
from urllib.parse import urlsplit

from hostler.bearer import token_id, valid_token
from hostler.cli.options import (
    DEFAULT_URL,
    TOKEN_VARIABLE,
    URL_VARIABLE,
    add_client_options,
    check_url,
    url_argument,
)
from hostler.errors import DaemonRefusedError, DaemonUnreachableError, HostlerError, SettingError
from hostler.paths import default_data_dir

__all__ = [
    "DEFAULT_URL",
    "URL_VARIABLE",
    "Credential",
    "add_client_options",
    "call",
    "check_url",
    "checks_answers",
    "credential_of",
    "daemon_url",
    "event_stream",
    "fetch",
    "post",
    "token_of",
    "url_argument",
]

#: The most of an answer read into memory (the largest, ``hostler ps --json``'s, is far less).
MAX_ANSWER = 64 * 2**20
#: How long a client waits for `GET /health` before it sends a data directory's token.
HOLDS_TIMEOUT = 5.0


def daemon_url(args: argparse.Namespace, *, default: str | None = DEFAULT_URL) -> str | None:
    """The daemon a command talks to: ``--url``, else ``$HOSTLER_URL``, else ``default``.

    A command that always talks to a daemon (``default`` given) asks, before ``default``, the
    one the data directory's ``address`` file names (where its ``hostler serve`` said it
    listens: ``--port 0`` then needs no ``--url``); a command that is local unless told
    (``default`` None) stays local.

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
    if default is None:
        return None
    folder: Path = getattr(args, "data_dir", None) or default_data_dir()
    try:
        with (folder / "address").open("rb") as file:
            served = file.read(1024).decode("utf-8").strip()
        return check_url(served)
    except (OSError, UnicodeDecodeError, ValueError):  # none, or not one: the default
        return default


@dataclass(frozen=True, slots=True)
class Credential:
    """The token a command sends (None: none) and where it came from, in words for people.

    Attributes:
        token: The bearer token, or None.
        source: ``--token``, ``$HOSTLER_TOKEN``, ``DIR/token`` or why none is sent.
        folder: The data directory whose token file was read (or would have been).
    """

    token: str | None
    source: str
    folder: Path


def credential_of(args: argparse.Namespace) -> Credential:
    """``--token``, else ``$HOSTLER_TOKEN`` (the daemon's own), else the ``token`` file, else none.

    The data directory's token file is sent only to the address its daemon listens on (the
    ``address`` file it writes at start): it is that daemon's secret, never handed to another
    URL (give ``--token`` for any other).

    Raises:
        SettingError: ``$HOSTLER_TOKEN`` is set and cannot be a token.
    """
    folder: Path = getattr(args, "data_dir", None) or default_data_dir()
    if getattr(args, "token", None):
        return Credential(str(args.token), "--token", folder)
    named = os.environ.get(TOKEN_VARIABLE, "")
    if named:
        if not valid_token(named):  # never echoed: it is a secret
            raise SettingError(
                f"{TOKEN_VARIABLE}: not a token (32 to 256 printable characters, no space); "
                "fix it or unset the variable"
            )
        return Credential(named, f"${TOKEN_VARIABLE}", folder)
    return _file_credential(args, folder)


def _file_credential(args: argparse.Namespace, folder: Path) -> Credential:
    """The data directory's token, when the URL asked is where its daemon listens."""
    try:
        token = (folder / "token").read_text(encoding="utf-8").strip()
    except OSError:
        return Credential(None, f"no token: {folder} holds no token file", folder)
    try:
        served = (folder / "address").read_text(encoding="utf-8").strip()
    except OSError:  # a token, but no daemon of this folder has said where it listens
        return Credential(
            None,
            f"no token: {folder} holds a token but no address file (a hostler serve of this "
            "data directory writes it at start), so its token is sent nowhere",
            folder,
        )
    url = daemon_url(args)
    if url is None or _endpoint(url) != _endpoint(served):
        # the data directory's token goes to its own daemon only
        return Credential(None, f"no token: {folder}'s daemon listens at {served[:200]}", folder)
    if not token:
        return Credential(None, f"no token: {folder / 'token'} is empty", folder)
    if not _holds(url, token):  # a stale address: another daemon may listen there now
        return Credential(
            None,
            f"no token: the hostler serve at {url[:200]} does not hold {folder}'s token (its "
            "address file is left from a daemon that stopped, and another took the port); "
            f"start {folder}'s, or give --url",
            folder,
        )
    return Credential(token, f"the token of {folder / 'token'}", folder)


def _holds(url: str, token: str) -> bool:
    """Whether the daemon at ``url`` says (``GET /health``) it holds ``token``.

    False when nothing answers: the command's own request then says so.
    """
    try:
        answer = call("GET", url.rstrip("/"), "/health", None, timeout=HOLDS_TIMEOUT)
    except HostlerError:
        return False
    return isinstance(answer, dict) and answer.get("token_id") == token_id(token)


def token_of(args: argparse.Namespace) -> str | None:
    """The token to send (see :func:`credential_of`), or None.

    Raises:
        SettingError: ``$HOSTLER_TOKEN`` is set and cannot be a token.
    """
    return credential_of(args).token


def _endpoint(url: str) -> tuple[str, int | None] | None:
    """``url``'s host (lower-cased, ``localhost`` as ``127.0.0.1``) and port, to compare."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    return ("127.0.0.1" if host == "localhost" else host), port


def unauthorized(refused: DaemonRefusedError, credential: Credential) -> DaemonRefusedError:
    """A 401 told with the token sent, where it came from, and the fix that works."""
    return DaemonRefusedError(
        f"{refused.message} (sent {credential.source}); give the data directory of the daemon "
        f"at that address with --data-dir DIR (its token is DIR/token), or its token with "
        f"--token or ${TOKEN_VARIABLE}",
        refused.status,
    )


P = ParamSpec("P")


def checks_answers(
    command: Callable[Concatenate[argparse.Namespace, P], int],
) -> Callable[Concatenate[argparse.Namespace, P], int]:
    """``command`` (a client command), with a daemon answer of the wrong shape as one line.

    What a daemon answers is input from outside: something else on the port, or another
    version, may answer 200 with JSON the command cannot read. That is said in one line
    (``daemon.refused``), never a traceback. A 401 (the wrong token, or none) says which token
    was sent and from where (:func:`unauthorized`).
    """

    @functools.wraps(command)
    def checked(args: argparse.Namespace, /, *rest: P.args, **kwargs: P.kwargs) -> int:
        try:
            return command(args, *rest, **kwargs)
        except DaemonRefusedError as exc:
            if exc.status != 401:
                raise
            raise unauthorized(exc, credential_of(args)) from None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise DaemonRefusedError(
                f"the answer is not one hostler serve gives ({type(exc).__name__}: "
                f"{str(exc)[:80]}): is that address hostler serve, of this version?"
            ) from None

    return checked


def _headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _unreachable(url: str, exc: BaseException) -> DaemonUnreachableError:
    return DaemonUnreachableError(
        f"no hostler serve answers at {url[:200]} ({type(exc).__name__}); start it with "
        "`hostler serve`, or give --url"
    )


def _refused(url: str, path: str, status: int, body: bytes) -> DaemonRefusedError:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace")
    return DaemonRefusedError(f"{url[:200]}{path}: {status}: {str(message)[:500]}", status)


def _open(
    method: str,
    url: str,
    path: str,
    token: str | None,
    *,
    body: bytes | None,
    timeout: float,
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A request sent and its answer's head read; the caller closes the connection."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname or "", parts.port, timeout=timeout)
    headers = _headers(token)
    if body is not None:
        headers["content-type"] = "application/json"
    try:
        connection.request(method, parts.path + path, body=body, headers=headers)
        return connection, connection.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise _unreachable(url, exc) from None


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
        DaemonUnreachableError: Nothing answers there, or the answer is not JSON.
        DaemonRefusedError: It answered with an error (the status and the daemon's message).
    """
    content = None if body is None else json.dumps(body).encode()
    connection, response = _open(method, url, path, token, body=content, timeout=timeout)
    try:
        data = response.read(MAX_ANSWER)
    except (OSError, http.client.HTTPException) as exc:
        raise _unreachable(url, exc) from None
    finally:
        connection.close()
    if response.status != 200:
        raise _refused(url, path, response.status, data)
    try:
        return json.loads(data)
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

    Each is ``{"seq", "recorded_at", "stream", "version", "type", "payload"}``. It ends only
    when no event came for ``idle`` seconds (None: never); resume from the last seq seen.

    Raises:
        DaemonUnreachableError: Nothing answers there, or the stream broke off.
        DaemonRefusedError: It refused (the status and the daemon's message).
    """
    path = f"/api/events?after={after}"
    connection, answer = _open("GET", url, path, token, body=None, timeout=10.0)
    try:
        if answer.status != 200:
            raise _refused(url, path, answer.status, answer.read(MAX_ANSWER))
        if connection.sock is not None:
            connection.sock.settimeout(idle)  # from here on, a read waits at most ``idle``
        while line := answer.readline(MAX_ANSWER):
            if line.startswith(b"data: "):
                yield json.loads(line[6:])
    except TimeoutError:
        return  # quiet for ``idle`` seconds: the caller resumes, or stops
    except (OSError, http.client.HTTPException) as exc:
        raise _unreachable(url, exc) from None
    finally:
        connection.close()
