"""The proxy's client to its engines: a pooled HTTP/1.1 client over loopback, and an httpx one.

The proxy's cost is a headline number, so its client was chosen by measurement
(``bench/proxy.py``, docs/benchmarks.md): :class:`PooledUpstream` keeps idle keep-alive
connections per engine port and parses answers with ``httptools`` (the parser uvicorn uses),
with nothing else between the socket and the relay; :class:`HttpxUpstream` does the same work
through ``httpx`` and stays as the reference the benchmark compares against.

Both give an :class:`UpstreamResponse` whose body is read as it arrives. Closing it before the
answer is complete closes the connection — that is how an engine learns its client left (llama.cpp
stops generating and frees the slot). A connection goes back to the pool only after a complete
answer the engine agreed to keep alive.
"""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import AsyncIterator
from typing import Protocol

import anyio
import anyio.abc
import httptools
import httpx

__all__ = [
    "HttpxUpstream",
    "PooledUpstream",
    "Upstream",
    "UpstreamError",
    "UpstreamResponse",
]

#: The largest response head accepted from an engine (bytes); past it the answer is refused.
MAX_HEAD = 64 * 1024
#: Idle connections kept per engine port; more are closed when they come back.
MAX_IDLE_PER_PORT = 64
CONNECT_TIMEOUT = 10.0
READ_SIZE = 65536


class UpstreamError(Exception):
    """The engine could not be reached, or its answer broke off or was not HTTP."""


class UpstreamResponse(Protocol):
    """An engine's answer: status and head now, the body as it arrives."""

    status: int
    headers: list[tuple[str, str]]

    def body(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come (transfer encoding removed)."""
        ...

    async def aclose(self) -> None:
        """Finish with the answer: an incomplete one closes its connection."""
        ...


class Upstream(Protocol):
    """What the proxy needs of a client: one POST to an engine on loopback."""

    async def send(self, port: int, path: str, body: bytes, content_type: str) -> UpstreamResponse:
        """Send ``body`` to ``127.0.0.1:port`` and return once the answer's head is in.

        Raises:
            UpstreamError: Nothing answers there, or the answer is not HTTP.
        """
        ...

    async def forget(self, port: int) -> None:
        """Close the idle connections to ``port`` (its engine is about to stop)."""
        ...

    async def aclose(self) -> None:
        """Close every connection."""
        ...


class _Connection:
    """One keep-alive connection and the parser of the answer being read on it."""

    def __init__(self, port: int, stream: anyio.abc.SocketStream) -> None:
        self.port = port
        self.stream = stream
        self.sock: socket.socket = stream.extra(anyio.abc.SocketAttribute.raw_socket)  # noqa: S610 - anyio's typed extras
        self.reused = False

    def looks_closed(self) -> bool:
        """Whether the engine has closed it while idle (readable with nothing asked = EOF)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)


class _Answer:
    """An answer read from a :class:`_Connection` by ``httptools``."""

    def __init__(self, pool: PooledUpstream, conn: _Connection) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self._chunks: list[bytes] = []
        self._head_done = False
        self._done = False
        self._head_bytes = 0
        self._keep_alive = False
        self._parser = httptools.HttpResponseParser(self)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        """Collect one header (names lower-cased)."""
        self.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        """The head is in."""
        self._head_done = True
        self.status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()  # only valid until the body ends

    def on_body(self, body: bytes) -> None:
        """Keep a piece of the body for the reader."""
        self._chunks.append(bytes(body))

    def on_message_complete(self) -> None:
        """The answer is whole."""
        self._done = True

    async def _feed(self) -> bool:
        """Read once from the engine into the parser; False at end of stream."""
        assert self._conn is not None  # noqa: S101 - callers check
        try:
            data = await self._conn.stream.receive(READ_SIZE)
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise UpstreamError(f"the engine's answer is not HTTP ({exc})") from None
        if not self._head_done:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                raise UpstreamError("the engine's answer head is too large")
        return True

    async def read_head(self) -> bool:
        """Read until the head is in; False when the connection ended before any byte."""
        got_any = False
        while not self._head_done:
            if not await self._feed():
                if got_any:
                    raise UpstreamError("the engine closed the connection mid-answer")
                return False
            got_any = True
        return True

    async def body(self) -> AsyncIterator[bytes]:
        """The body as it arrives; the connection goes back to the pool when it is whole."""
        while True:
            if self._chunks:
                # what one read brought comes out as one piece: nothing waits for it, and the
                # client gets one write instead of several (less CPU beside the engine)
                chunks, self._chunks = self._chunks, []
                yield chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self._done:
                await self._finish(reusable=self._keep_alive)
                return
            if self._conn is None:
                return
            if not await self._feed():
                await self._finish(reusable=False)
                if self._chunks:  # what came before the end goes out first
                    chunks, self._chunks = self._chunks, []
                    yield b"".join(chunks)
                if self._delimited():  # a length or chunks were promised: it broke off
                    raise UpstreamError("the engine's answer broke off (its connection closed)")
                return

    def _delimited(self) -> bool:
        """Whether the answer's head gave its end (a length, or chunks) instead of the close."""
        return any(
            name == "content-length" or (name == "transfer-encoding" and "chunked" in value)
            for name, value in self.headers
        )

    async def _finish(self, *, reusable: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._pool.give_back(conn, reusable=reusable)

    async def aclose(self) -> None:
        """Done with it: a whole answer frees the connection for reuse, a partial one closes it."""
        await self._finish(reusable=self._done and self._keep_alive)


class PooledUpstream:
    """HTTP/1.1 to engines on 127.0.0.1 over kept-alive connections, parsed by ``httptools``."""

    def __init__(self) -> None:
        self._idle: dict[int, list[_Connection]] = {}
        self._closed = False

    async def _connect(self, port: int) -> _Connection:
        try:
            with anyio.fail_after(CONNECT_TIMEOUT):
                stream = await anyio.connect_tcp("127.0.0.1", port)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to 127.0.0.1:{port} ({exc})") from None
        return _Connection(port, stream)

    async def _take_idle(self, port: int) -> _Connection | None:
        idle = self._idle.get(port)
        while idle:
            conn = idle.pop()
            if not conn.looks_closed():
                conn.reused = True
                return conn
            await _close(conn)
        return None

    async def give_back(self, conn: _Connection, *, reusable: bool) -> None:
        """Return ``conn`` to the pool, or close it."""
        idle = self._idle.setdefault(conn.port, [])
        if reusable and not self._closed and len(idle) < MAX_IDLE_PER_PORT:
            idle.append(conn)
        else:
            await _close(conn)

    async def send(self, port: int, path: str, body: bytes, content_type: str) -> UpstreamResponse:
        """POST ``body`` to the engine; a kept connection the engine dropped is retried fresh."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Accept-Encoding: identity\r\n\r\n"
        ).encode("latin-1")
        for _ in range(2):
            conn = await self._take_idle(port) or await self._connect(port)
            answer = _Answer(self, conn)
            try:
                await conn.stream.send(head + body)
                if await answer.read_head():
                    return answer
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                await answer._finish(reusable=False)
                if not conn.reused:
                    raise UpstreamError(f"the engine on port {port} dropped the request") from exc
                continue
            except BaseException:
                await answer._finish(reusable=False)
                raise
            await answer._finish(reusable=False)
            if not conn.reused:  # a fresh connection closed without a byte: the engine is gone
                raise UpstreamError(f"the engine on port {port} closed the connection")
        raise UpstreamError(f"the engine on port {port} keeps closing connections")

    async def forget(self, port: int) -> None:
        """Close the idle connections to ``port``: its engine stops sooner without them."""
        for conn in self._idle.pop(port, []):
            await _close(conn)

    async def aclose(self) -> None:
        """Close every idle connection; answers still being read close as they finish."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                await _close(conn)


async def _close(conn: _Connection) -> None:
    """Close a connection, even from a cancelled task."""
    with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
        await conn.stream.aclose()


class _HttpxAnswer:
    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers = [(k.lower(), v) for k, v in response.headers.items()]

    async def body(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(f"the engine's answer broke off ({type(exc).__name__})") from None

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxUpstream:
    """The same work through ``httpx`` (the benchmark's reference)."""

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._own = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=MAX_IDLE_PER_PORT),
        )

    async def send(self, port: int, path: str, body: bytes, content_type: str) -> UpstreamResponse:
        """POST ``body`` to the engine through httpx."""
        request = self._client.build_request(
            "POST",
            f"http://127.0.0.1:{port}{path}",
            content=body,
            headers={"content-type": content_type},
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from None
        return _HttpxAnswer(response)

    async def forget(self, port: int) -> None:
        """Nothing: httpx's pool cannot drop one host's connections (so its engine waits)."""

    async def aclose(self) -> None:
        """Close the client if this object made it."""
        if self._own:
            await self._client.aclose()
