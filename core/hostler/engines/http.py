"""A minimal HTTP/1.1 client over anyio sockets for readiness and health probes (loopback only)."""

from __future__ import annotations

import os
import re
import socket
from abc import ABC, abstractmethod
from dataclasses import dataclass

import anyio
import anyio.abc

from hostler.clock import SYSTEM_CLOCK, Clock

__all__ = [
    "HTTP_TRANSPORT",
    "MAX_PROBE_BODY",
    "PROBE_METHODS",
    "EngineTransport",
    "HttpTransport",
    "Probe",
    "connect_loopback",
    "header_value_problem",
    "probe_path_problem",
    "probe_response",
    "probe_status",
]

#: The most of a probe response's body that is read (and handed to the adapter).
MAX_PROBE_BODY = 64 * 1024
_MAX_HEAD = 16 * 1024
#: RD1: the methods a probe may send.
PROBE_METHODS = ("GET", "POST")
# a request target written into the request line as it is: visible ASCII only
_PATH = re.compile(r"/[\x21-\x7e]*")
# a header field's value: printable ASCII (spaces included), no CR, LF or control
_HEADER_VALUE = re.compile(r"[\x20-\x7e]+")


def probe_path_problem(path: object) -> str | None:
    """Why ``path`` cannot be a probe's request target (RD1), or None when it can.

    It starts with '/' and holds visible ASCII only: no space, CR, LF, control or non-ASCII
    character (written into the request line as it is, it must be exactly what is sent;
    percent-encode anything else).
    """
    if not isinstance(path, str) or not path.startswith("/"):
        return f"readiness path {path!r} must start with '/'"
    if not _PATH.fullmatch(path):
        return (
            f"readiness path {path!r} must be visible ASCII: no space, CR, LF or non-ASCII "
            "character (percent-encode it)"
        )
    return None


def header_value_problem(name: str, value: object) -> str | None:
    """Why ``value`` cannot be sent as the header field ``name``, or None when it can."""
    if not isinstance(value, str) or not _HEADER_VALUE.fullmatch(value):
        return f"readiness {name} {value!r} must be printable ASCII, with no CR or LF"
    return None


def _request(method: str, path: str, port: int, body: bytes | None, content_type: str) -> bytes:
    """The request's bytes.

    Raises:
        ValueError: A part HTTP cannot carry as it is (a non-ASCII path, a CR or LF, a method
            other than GET or POST): one line saying which, never a UnicodeEncodeError.
    """
    problem = probe_path_problem(path)
    if problem is None and method not in PROBE_METHODS:
        problem = f"readiness method {method!r} must be 'GET' or 'POST'"
    if problem is None and body is not None:
        problem = header_value_problem("content_type", content_type)
    if problem is not None:
        raise ValueError(problem)
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    if body is not None:
        lines += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (body or b"")


async def probe_status(
    port: int, path: str, *, wait: float = 2.0, clock: Clock = SYSTEM_CLOCK
) -> int | None:
    """The status code of ``GET http://127.0.0.1:port/path``, or None if nothing answered."""
    answer = await probe_response(port, path, wait=wait, with_body=False, clock=clock)
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
    clock: Clock = SYSTEM_CLOCK,
) -> tuple[int, bytes] | None:
    """``(status, body)`` of one request to ``http://127.0.0.1:port/path``, or None.

    None when nothing answered within ``wait`` seconds or the answer is not HTTP. The body
    is read up to :data:`MAX_PROBE_BODY` bytes (by ``Content-Length``, chunks, or to the
    close); without ``with_body`` only the status line is waited for.

    Raises:
        ValueError: The request cannot be sent as it is (see :func:`probe_path_problem`).
    """
    request = _request(method, path, port, body, content_type)
    with clock.move_on_after(wait):
        data = b""
        try:
            async with await connect_loopback(port) as stream:
                await stream.send(request)
                while not _complete(data, with_body):
                    data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            if not data:
                return None
        return _parse(data)
    return None


async def connect_loopback(port: int) -> anyio.abc.SocketStream:
    """A TCP stream to ``127.0.0.1:port``, connected on the event loop.

    ``anyio.connect_tcp`` resolves even an address literal in a worker thread and races
    address families: about 0.5 ms of CPU per connection, paid every 10 ms by a readiness
    wait whose engine is still loading (refused). A non-blocking connect on loopback costs a
    fraction of that.

    Raises:
        OSError: Nothing listens there (``ECONNREFUSED``), or the connect failed otherwise.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            await anyio.wait_writable(sock)
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, os.strerror(error)) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return await anyio.abc.SocketStream.from_socket(sock)
    except BaseException:
        sock.close()
        raise


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


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe request to an engine on the loopback interface."""

    port: int
    path: str
    method: str = "GET"
    body: bytes | None = None
    content_type: str = "application/json"


class EngineTransport(ABC):
    """The seam through which a supervisor asks its engine's readiness and health.

    :data:`HTTP_TRANSPORT` sends real HTTP over loopback;
    :class:`hostler.testing.FakeTransport` answers from a test's handler (httpx's
    ``MockTransport``: a fake behind the real interface).
    """

    @abstractmethod
    async def probe(
        self, probe: Probe, *, wait: float, clock: Clock, with_body: bool = True
    ) -> tuple[int, bytes] | None:
        """``(status, body)`` of the probe, or None when nothing answered within ``wait``.

        Raises:
            ValueError: The request cannot be sent as it is (see :func:`probe_path_problem`).
        """


class HttpTransport(EngineTransport):
    """Real HTTP/1.1 over loopback (:func:`probe_response`)."""

    async def probe(
        self, probe: Probe, *, wait: float, clock: Clock, with_body: bool = True
    ) -> tuple[int, bytes] | None:
        """:func:`probe_response`."""
        return await probe_response(
            probe.port,
            probe.path,
            method=probe.method,
            body=probe.body,
            content_type=probe.content_type,
            wait=wait,
            with_body=with_body,
            clock=clock,
        )


#: Real HTTP: every supervisor's transport unless one is handed in.
HTTP_TRANSPORT = HttpTransport()
