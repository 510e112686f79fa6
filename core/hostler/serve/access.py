"""Who may reach the HTTP face: the refusal of an open public bind, and ``auth = "none"``.

A daemon that would listen beyond loopback without a token is refused before anything is
created (:func:`check_exposure`). With ``auth = "none"`` on loopback every route is open: the
app still checks a token, one made in memory for this run and handed to every request by
:func:`open_access` (never written anywhere), so the routes' own guard stays the one place
that decides.
"""

from __future__ import annotations

import secrets

from starlette.types import ASGIApp, Receive, Scope, Send

from hostler.errors import UsageError
from hostler.serve.server import is_loopback

__all__ = ["check_exposure", "open_access", "run_token"]


def check_exposure(host: str, port: int, auth: str) -> None:
    """Refuse to listen beyond loopback without a token.

    Raises:
        UsageError: ``host`` is not a loopback address and ``auth`` is ``"none"``.
    """
    if auth == "none" and not is_loopback(host):
        raise UsageError(
            f"refusing to listen on {host}:{port} without a token: every route would be open "
            'to the network; set auth = "token" (the default) or listen on 127.0.0.1'
        )


def run_token() -> str:
    """A token for one run of an open (``auth = "none"``) loopback server; never stored."""
    return secrets.token_urlsafe(32)


def open_access(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` with every HTTP request carrying ``token``: each route open (``auth = "none"``)."""
    header = (b"authorization", f"Bearer {token}".encode())

    async def opened(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = [h for h in scope.get("headers", []) if h[0].lower() != b"authorization"]
            scope = {**scope, "headers": [*headers, header]}
        await app(scope, receive, send)

    return opened
