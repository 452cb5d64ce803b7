"""A TCP proxy the test controls, between one process and a server (issue 28: the API's view of a
Postgres outage). ``cut`` closes every connection through it and refuses new ones, as a stopped
server or a dropped route would; ``heal`` accepts again on the same port; ``swallow_replies``
lets requests through but drops what the server answers (a statement that commits while its
answer is lost, as when the connection breaks right after the commit). Nothing else that uses
the server notices: the other processes and tests keep their own connections.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from pathlib import Path

from tests import support


class CutProxy:
    """127.0.0.1:<port> forwarded to ``target``: a unix socket path, or ``(host, port)``."""

    def __init__(self, target: Path | tuple[str, int]) -> None:
        self.target = target
        self.port = support.free_port()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._swallow = threading.Event()
        self.heal()

    def swallow_replies(self) -> None:
        """From now on (until ``heal``), the server's answers are dropped."""
        self._swallow.set()

    def heal(self) -> None:
        """Accept connections again (on the same port), answers passed on again."""
        self._swallow.clear()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name="cut-proxy").start()

    def cut(self) -> None:
        """Close every connection through the proxy and refuse new ones (connection refused)."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = self._pairs, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._stopped.set()
        self.cut()

    def _connect(self) -> socket.socket:
        if isinstance(self.target, Path):
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(str(self.target))
        else:
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
        return upstream

    def _accept(self, listener: socket.socket) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = self._connect()
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ, (b, False))
            sel.register(b, selectors.EVENT_READ, (a, True))  # what the server answers
            try:
                while True:
                    for key, _ in sel.select():
                        data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            return
                        to, is_reply = key.data
                        if not (is_reply and self._swallow.is_set()):
                            to.sendall(data)
            except (OSError, ValueError):
                return
            finally:
                for sock in (a, b):
                    with contextlib.suppress(OSError):
                        sock.close()
