"""Who may reach the HTTP face: the refusal of an open public bind, and ``auth = "none"``.

A daemon that would listen beyond loopback without a token is refused before anything is
created (:func:`check_exposure`). With ``auth = "none"`` on loopback every route is open
(``make_app(open_routes=True)``; no token is made or written).
"""

from __future__ import annotations

import ipaddress

from hostler.errors import UsageError

__all__ = ["check_exposure", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost`` counts)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
