"""A minimal HTTP/1.1 server on 127.0.0.1, on asyncio streams, in a background thread.

Why asyncio streams in a thread of its own (and not ``http.server.ThreadingHTTPServer``):

- Faults need control below what ``http.server`` exposes: answer nothing and hold the
  connection open past the client's timeout, or close it without a response. With one
  coroutine per connection that is a few lines, and holding hundreds of connections
  costs no threads.
- Latency is modelled with asyncio timers on one loop, so all server state (rate-limit
  windows, idempotency records, the ledger) is owned by one thread and needs no locks
  beyond the one guarding ledger snapshots for other threads.
- Its own loop in its own thread keeps it independent of the caller: the same context
  manager works from plain scripts, from notebooks (which already run a loop) and from
  async tests whose loop drives the client, and the client's work cannot stall the server.
- ``stop()`` cancels every connection coroutine and joins the thread: nothing lingers
  between tests, including keep-alive connections the client pool still holds.

Keep-alive is supported (HTTP/1.1 default, ``Connection: close`` honoured); request
bodies need ``Content-Length`` (chunked uploads get 411). The server never closes an idle
keep-alive connection by itself, which avoids the classic race of a client reusing a
connection the server is closing. Bound to loopback (127.0.0.1) unless another ``host`` is given:
this is a test and demo tool, with no authentication.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from aiqsim.core.errors import ConfigurationError
from aiqsim.core.failures import ProviderError

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One parsed request. Header names are lower-case."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    received_at: float
    """``time.monotonic()`` when the request head had arrived."""

    def json(self) -> Any:
        """The body decoded as JSON (raises ``ValueError`` if it is not)."""
        return json.loads(self.body.decode("utf-8"))


@dataclass(frozen=True, slots=True)
class HttpReply:
    """A response to send."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> HttpReply:
        """A JSON reply (``content-type: application/json``)."""
        merged = {"content-type": "application/json", **(headers or {})}
        return cls(status, json.dumps(payload, separators=(",", ":")).encode("utf-8"), merged)


@dataclass(frozen=True, slots=True)
class DropConnection:
    """Send no response at all: close at once (``hold_s=0``) or after the client gives up.

    With ``hold_s`` > 0 the connection stays open, unanswered, until the client closes it
    (its timeout fired), ``hold_s`` wall seconds pass (``None``: no limit), or the server stops.
    """

    hold_s: float | None = 0.0


class CutStream(ProviderError):
    """Raised by a :class:`StreamReply`'s ``parts`` to cut the stream: the connection is closed
    without the chunked body's last chunk, as a dropped connection looks to the client."""


@dataclass(frozen=True, slots=True)
class StreamReply:
    """A response whose body is written as ``parts`` yields it (``transfer-encoding: chunked``, each
    part flushed at once): server-sent events. ``parts`` raising :class:`CutStream` (or failing)
    closes the connection mid-body; ``on_end`` is called with ``True`` (the body was sent whole)
    or ``False`` (cut, or the client went away)."""

    status: int
    parts: AsyncIterator[bytes]
    headers: Mapping[str, str] = field(default_factory=dict)
    on_end: Callable[[bool], None] | None = None


Handler = Callable[[HttpRequest], Awaitable[HttpReply | DropConnection | StreamReply]]


class ServerStartError(ConfigurationError, RuntimeError):
    """The server could not listen on the requested address (port in use, host not local...).

    A :class:`~aiqsim.core.errors.ConfigurationError` (the address asked for cannot be used) and,
    as :meth:`LoopbackHttpServer.start` always raised, a ``RuntimeError``. Nothing was started.
    """

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot listen on {_authority(host, port)}: {reason}")
        self.host = host
        self.port = port
        self.reason = reason


def _authority(host: str, port: int) -> str:
    """``host:port`` as it goes in a URL (IPv6 literals in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen_failure(error: OSError) -> str:
    """A short reason for a failed bind, in the words a user searches for."""
    if error.errno == errno.EADDRINUSE:
        return "the port is already in use (pick another with --port, or 0 for any free port)"
    if error.errno == errno.EADDRNOTAVAIL:
        return "the address is not one of this machine's"
    if error.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    return error.strerror or str(error)


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LoopbackHttpServer:
    """Serve ``handler`` on ``host`` (``127.0.0.1``; ephemeral port by default) until :meth:`stop`.

    The handler is a coroutine function run on the server's own loop; it returns an
    :class:`HttpReply` or a :class:`DropConnection`. ``on_start`` runs once on that loop,
    when the socket listens and before :meth:`start` returns. Use as a context manager or
    call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        port: int = 0,
        name: str = "aiqsim-loopback",
        on_start: Callable[[], None] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigurationError(f"port must be an integer from 0 (any free port) to 65535, got {port!r}")
        self._handler = handler
        self.host = host
        self._on_start = on_start
        self._requested_port = port
        self._name = name
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port: int | None = None
        self.connections_accepted = 0
        """TCP connections accepted so far (keep-alive reuse shows as fewer connections than requests)."""

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        """``http://<host>:<port>``, e.g. ``http://127.0.0.1:54321`` (after :meth:`start`)."""
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://{_authority(self.host, self.port)}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The server's event loop (for scheduling work on the server thread)."""
        if self._loop is None:
            raise RuntimeError("server not started")
        return self._loop

    def start(self, timeout: float = 10.0) -> LoopbackHttpServer:
        """Start the thread and return once the socket listens.

        Raises :class:`ServerStartError` when the address cannot be listened on (the thread is gone).
        """
        if self._thread is not None:
            raise RuntimeError("server already started")
        self._thread = threading.Thread(target=self._thread_main, name=self._name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"{self._name} did not start within {timeout} s")
        if self._startup_error is not None:
            self._thread.join(timeout)
            self._thread = None
            error = self._startup_error
            if isinstance(error, OSError):
                raise ServerStartError(self.host, self._requested_port, _listen_failure(error)) from error
            raise RuntimeError(f"{self._name} failed to start") from error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every connection, stop the loop and join the thread (idempotent)."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None or loop is None or stopping is None:
            return
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"{self._name} did not stop within {timeout} s")
        self._thread = None

    def __enter__(self) -> LoopbackHttpServer:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _thread_main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # pragma: no cover - reported through start()
            self._startup_error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(
            self._on_connection, host=self.host, port=self._requested_port, limit=MAX_HEADER_BYTES
        )
        self.port = server.sockets[0].getsockname()[1]
        if self._on_start is not None:
            self._on_start()
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            server.close()
            for task in list(self._connections):
                task.cancel()
            if self._connections:
                await asyncio.gather(*self._connections, return_exceptions=True)
            await server.wait_closed()

    # ------------------------------------------------------------------ connections
    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.connections_accepted += 1
        try:
            await self._serve_connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # the client closed an idle keep-alive connection
            except asyncio.LimitOverrunError:
                await self._write(writer, HttpReply(431, b"request header too large"), keep_alive=False)
                return
            received_at = time.monotonic()
            try:
                request, keep_alive = await self._parse(head, reader, received_at)
            except _BadRequest as exc:
                await self._write(writer, HttpReply(exc.status, str(exc).encode()), keep_alive=False)
                return
            try:
                reply = await self._handler(request)
            except Exception as exc:
                reply = HttpReply.json(
                    500, {"error": {"message": f"handler failed: {exc!r}", "type": "server_error"}}
                )
            if isinstance(reply, DropConnection):
                await self._drop(reader, writer, reply)
                return
            if isinstance(reply, StreamReply):
                if not await self._write_stream(writer, reply, keep_alive=keep_alive) or not keep_alive:
                    return
                continue
            await self._write(writer, reply, keep_alive=keep_alive)
            if not keep_alive:
                return

    async def _parse(
        self, head: bytes, reader: asyncio.StreamReader, received_at: float
    ) -> tuple[HttpRequest, bool]:
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes any byte
            raise _BadRequest(400, "undecodable request head") from exc
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(400, f"bad request line {lines[0]!r}")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep:
                raise _BadRequest(400, f"bad header line {line!r}")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise _BadRequest(411, "chunked request bodies are not supported; send Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise _BadRequest(400, "bad Content-Length") from exc
        if length < 0 or length > MAX_BODY_BYTES:
            raise _BadRequest(413, "request body too large")
        body = await reader.readexactly(length) if length else b""
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        split = urlsplit(target)
        request = HttpRequest(
            method=method.upper(),
            path=unquote(split.path),
            query=dict(parse_qsl(split.query)),
            headers=headers,
            body=body,
            received_at=received_at,
        )
        return request, keep_alive

    async def _write(self, writer: asyncio.StreamWriter, reply: HttpReply, *, keep_alive: bool) -> None:
        try:
            reason = HTTPStatus(reply.status).phrase
        except ValueError:
            reason = "Unknown"
        lines = [f"HTTP/1.1 {reply.status} {reason}"]
        for name, value in reply.headers.items():
            if name.lower() not in ("content-length", "connection"):
                lines.append(f"{name}: {value}")
        lines.append(f"content-length: {len(reply.body)}")
        lines.append(f"connection: {'keep-alive' if keep_alive else 'close'}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body)
        await writer.drain()

    async def _write_stream(
        self, writer: asyncio.StreamWriter, reply: StreamReply, *, keep_alive: bool
    ) -> bool:
        """Write a :class:`StreamReply`; False when the body was cut (the connection is then closed)."""
        try:
            reason = HTTPStatus(reply.status).phrase
        except ValueError:
            reason = "Unknown"
        lines = [f"HTTP/1.1 {reply.status} {reason}"]
        for name, value in reply.headers.items():
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                lines.append(f"{name}: {value}")
        lines.append("transfer-encoding: chunked")
        lines.append(f"connection: {'keep-alive' if keep_alive else 'close'}")
        whole = False
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            await writer.drain()
            try:
                async for part in reply.parts:
                    if part:
                        writer.write(f"{len(part):x}\r\n".encode("ascii") + part + b"\r\n")
                        await writer.drain()
            except Exception:  # CutStream, a failing source, or the client gone: the body is cut short
                return False  # (no last chunk; the connection is aborted below)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            whole = True
            return True
        finally:
            if not whole:
                writer.transport.abort()
            closer = getattr(reply.parts, "aclose", None)
            try:
                if closer is not None:  # a body left early (a cut, the client gone) is closed now
                    with contextlib.suppress(Exception):
                        await closer()
            finally:  # told even when closing the body was cancelled: the server's count stays right
                if reply.on_end is not None:
                    reply.on_end(whole)

    async def _drop(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, drop: DropConnection
    ) -> None:
        if drop.hold_s is None or drop.hold_s > 0:
            with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
                await asyncio.wait_for(_until_eof(reader), drop.hold_s)
        writer.transport.close()  # FIN without a response: "server disconnected" on the client


async def _until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass
