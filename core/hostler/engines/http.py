"""A minimal HTTP/1.1 client over anyio sockets for readiness and health probes (loopback only)."""

from __future__ import annotations

import anyio

__all__ = ["MAX_PROBE_BODY", "probe_response", "probe_status"]

#: The most of a probe response's body that is read (and handed to the adapter).
MAX_PROBE_BODY = 64 * 1024
_MAX_HEAD = 16 * 1024


async def probe_status(port: int, path: str, *, wait: float = 2.0) -> int | None:
    """The status code of ``GET http://127.0.0.1:port/path``, or None if nothing answered."""
    answer = await probe_response(port, path, wait=wait, with_body=False)
    return None if answer is None else answer[0]


async def probe_response(
    port: int,
    path: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    content_type: str = "application/json",
    wait: float = 2.0,
    with_body: bool = True,
) -> tuple[int, bytes] | None:
    """``(status, body)`` of one request to ``http://127.0.0.1:port/path``, or None.

    None when nothing answered within ``wait`` seconds or the answer is not HTTP. The body
    is read up to :data:`MAX_PROBE_BODY` bytes (by ``Content-Length``, chunks, or to the
    close); without ``with_body`` only the status line is waited for.
    """
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    if body is not None:
        lines += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (body or b"")
    with anyio.move_on_after(wait):
        data = b""
        try:
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(request)
                while not _complete(data, with_body):
                    data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            if not data:
                return None
        return _parse(data)
    return None


def _complete(data: bytes, with_body: bool) -> bool:
    """Whether enough of the response is in: its status line, or its head and body."""
    if not with_body:
        return b"\r\n" in data or len(data) >= _MAX_HEAD
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return len(data) >= _MAX_HEAD
    fields = _fields(head)
    if fields.get("transfer-encoding", "").lower() == "chunked":
        return rest.endswith(b"0\r\n\r\n") or len(rest) >= MAX_PROBE_BODY
    length = fields.get("content-length", "")
    if length.isdigit():
        return len(rest) >= min(int(length), MAX_PROBE_BODY)
    return len(rest) >= MAX_PROBE_BODY


def _fields(head: bytes) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            found[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return found


def _parse(data: bytes) -> tuple[int, bytes] | None:
    parts = data.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return None
    head, _sep, rest = data.partition(b"\r\n\r\n")
    if _fields(head).get("transfer-encoding", "").lower() == "chunked":
        rest = _unchunk(rest)
    return int(parts[1]), rest[:MAX_PROBE_BODY]


def _unchunk(data: bytes) -> bytes:
    """A chunked body's content (what arrived of it)."""
    out = b""
    while data:
        size_line, sep, data = data.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
        except ValueError:
            break
        if not sep or size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return out
