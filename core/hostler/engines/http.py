"""A minimal HTTP/1.1 GET over anyio sockets for readiness and health probes (loopback only)."""

from __future__ import annotations

import anyio

__all__ = ["probe_status"]


async def probe_status(port: int, path: str, *, wait: float = 2.0) -> int | None:
    """The status code of ``GET http://127.0.0.1:port/path``, or None if nothing answered."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    with anyio.move_on_after(wait):
        try:
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(request)
                head = b""
                while b"\r\n" not in head and len(head) < 4096:
                    head += await stream.receive()
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError):
            return None
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) >= 2 and parts[1].isdigit():
            return int(parts[1])
        return None
    return None
