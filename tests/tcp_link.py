"""A loopback TCP link between a client and a real server that a test can cut and bring back.

``TcpLink(("127.0.0.1", server_port))`` listens on a port of its own and forwards every connection
to the server, byte for byte, in both directions. :meth:`TcpLink.cut` closes every forwarded
connection and stops listening (as a network cut or a server restart looks to the client: the
next read fails, a new connection is refused); :meth:`TcpLink.restore` listens on the same port
again. :meth:`TcpLink.lose_the_answer_to` loses one message's answer (or the message itself) and
then the client's side of that connection, leaving the server's side open, as a network path that
dies between the two does. Real sockets on 127.0.0.1 only; no mock of the client library.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from types import TracebackType


class TcpLink:
    """A cuttable forwarder from ``127.0.0.1:<port>`` to ``server`` (see the module docs)."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.port = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._threads: list[threading.Thread] = []
        self._trap: tuple[bytes, bool, bool] | None = None
        self._stranded: list[socket.socket] = []  # server sides left open by a sprung trap
        self.sprung = threading.Event()
        """Set once an armed :meth:`lose_the_answer_to` has cut its connection."""
        self.restore()

    def restore(self) -> None:
        """Listen (again, on the same port once one was chosen) and forward new connections."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self.port = listener.getsockname()[1]
        self._listener = listener
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def lose_the_answer_to(self, marker: bytes, *, delivered: bool, then_refuse: bool = False) -> None:
        """Arm a one-shot trap on the next chunk a client sends that contains ``marker``.

        With ``delivered`` the chunk reaches the server, the server's answer is read and dropped,
        and then the client's connection is closed: the client never learns the server acted.
        Without, the chunk itself is dropped and the client's connection closed. Either way the
        server's side stays open (until :meth:`cut`): the server learns of the loss only later.
        With ``then_refuse`` the link also stops listening before the client's side is closed, so
        the client cannot reach the server again until :meth:`restore`."""
        with self._lock:
            self._trap = (marker, delivered, then_refuse)
        self.sprung.clear()

    def _spring(self, data: bytes) -> tuple[bool, bool] | None:
        """``(delivered, then_refuse)`` if ``data`` sets off the armed trap (disarming it), else None."""
        with self._lock:
            if self._trap is None or self._trap[0] not in data:
                return None
            _, delivered, then_refuse = self._trap
            self._trap = None
            return delivered, then_refuse

    def cut(self) -> None:
        """Close every forwarded connection and stop listening: connecting is refused until
        :meth:`restore`."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = self._pairs, []
            stranded, self._stranded = self._stranded, []
        for end in stranded:
            end.close()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for client, upstream in pairs:
            for end in (client, upstream):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def close(self) -> None:
        self.cut()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> TcpLink:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut: the listener was closed
                return
            try:
                upstream = socket.create_connection(self.server, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    client.close()
                    upstream.close()
                    return
                self._pairs.append((client, upstream))
            thread = threading.Thread(target=self._forward, args=(client, upstream), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _forward(self, client: socket.socket, upstream: socket.socket) -> None:
        other = {client: upstream, upstream: client}
        answer_lost = False  # a delivered trap: the server's next answer is dropped, then the client cut
        refuse = False
        with selectors.DefaultSelector() as selector:
            selector.register(client, selectors.EVENT_READ)
            selector.register(upstream, selectors.EVENT_READ)
            while True:
                try:
                    ready = selector.select(timeout=1.0)
                except (OSError, ValueError):  # a socket was closed by cut()
                    return
                for key, _ in ready:
                    source = key.fileobj
                    assert isinstance(source, socket.socket)
                    try:
                        data = source.recv(65536)
                        if not data:
                            raise OSError("closed")
                        trap = self._spring(data) if source is client else None
                        if trap is not None:
                            delivered, refuse = trap
                            if delivered:
                                upstream.sendall(data)
                                answer_lost = True
                                continue
                            self._strand(client, upstream, refuse)
                            return
                        if answer_lost and source is upstream:
                            self._strand(client, upstream, refuse)
                            return
                        other[source].sendall(data)
                    except OSError:
                        for end in (client, upstream):
                            with contextlib.suppress(OSError):
                                end.close()
                        return
                if client.fileno() < 0 or upstream.fileno() < 0:
                    return

    def _strand(self, client: socket.socket, upstream: socket.socket, refuse: bool) -> None:
        """Close the client's side of a forwarded connection; keep the server's open until cut().
        With ``refuse``, stop listening first."""
        if refuse:
            with self._lock:
                listener, self._listener = self._listener, None
            if listener is not None:
                with contextlib.suppress(OSError):
                    listener.shutdown(socket.SHUT_RDWR)
                listener.close()
        with self._lock:
            self._pairs = [pair for pair in self._pairs if pair[0] is not client]
            self._stranded.append(upstream)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        client.close()
        self.sprung.set()
