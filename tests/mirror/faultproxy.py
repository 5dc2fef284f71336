"""A TCP proxy on 127.0.0.1 that injects connection faults into real HTTP traffic.

``CutProxy(upstream_port, cut={"/bucket/key": 1 << 20})`` forwards every connection to the
upstream server unchanged, except that the first response to a ``GET`` of each named path is cut
after that many bytes (headers included): the proxy closes both sockets mid-body, as a dropped
connection would. ``Refuser`` accepts connections and closes them at once, counting them: an S3
endpoint that is there but never answers.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class _Server:
    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class Refuser(_Server):
    """Accepts each connection and closes it without a byte; ``connections`` counts them."""

    def __init__(self) -> None:
        self.connections = 0
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        with self._lock:
            self.connections += 1
        conn.close()


class CutProxy(_Server):
    """Forwards to ``127.0.0.1:upstream``; cuts the first response to ``GET <path>`` after ``cut[path]`` bytes."""

    def __init__(self, upstream: int, cut: dict[str, int]) -> None:
        self._upstream = upstream
        self._cut = dict(cut)
        self.cuts: list[str] = []
        super().__init__()

    def handle(self, client: socket.socket) -> None:
        up = socket.create_connection(("127.0.0.1", self._upstream))
        armed: list[int | None] = [None]  # bytes left before the cut, for the response in progress

        def to_upstream() -> None:
            try:
                while data := client.recv(65536):
                    line = data.split(b"\r\n", 1)[0].decode("latin-1")
                    if line.startswith("GET "):
                        path = line.split(" ")[1].split("?")[0]
                        with self._lock:
                            left = self._cut.pop(path, None)
                            if left is not None:
                                self.cuts.append(path)
                        armed[0] = left
                    up.sendall(data)
            except OSError:
                pass
            finally:
                _shut(up)

        threading.Thread(target=to_upstream, daemon=True).start()
        try:
            while data := up.recv(65536):
                left = armed[0]
                if left is not None and len(data) >= left:
                    client.sendall(data[:left])
                    break  # the cut: both sides closed mid-body
                if left is not None:
                    armed[0] = left - len(data)
                client.sendall(data)
        except OSError:
            pass
        finally:
            _shut(client)
            _shut(up)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
