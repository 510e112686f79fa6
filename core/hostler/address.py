"""Where ``hostler serve`` listens unless told otherwise (its config and its clients agree here)."""

from __future__ import annotations

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "DEFAULT_URL"]

#: ``hostler serve``'s default address and port (Ollama's port is 11434; llama-server's 8080).
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 11435
#: Where the client commands look for it when neither ``--url`` nor ``$HOSTLER_URL`` is given.
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
