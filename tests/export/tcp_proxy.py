"""A TCP proxy on a loopback port that tests control: S3 "goes down" for real (connections refused
and cut), not through a mock.

    with TcpProxy(upstream_port) as proxy:        # http://127.0.0.1:{proxy.port} reaches upstream
        proxy.cut_after(9 << 20)                  # after 9 MiB client→server: cut everything, refuse new
        proxy.down()  /  proxy.up()               # refuse / accept again, same port
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.host, self.upstream = host, upstream_port
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._budget: int | None = None
        self.tripped = threading.Event()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def up(self) -> None:
        """Listen (again, on the same port once one was chosen)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        self._listener = sock
        self._budget = None
        self.tripped.clear()
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def down(self) -> None:
        """Stop listening and reset every open connection: new connections are refused."""
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                c.close()

    def cut_after(self, nbytes: int) -> None:
        """Go down once ``nbytes`` more have passed from clients to the upstream."""
        with self._lock:
            self._budget = nbytes

    def __enter__(self) -> TcpProxy:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection((self.host, self.upstream))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while data := src.recv(65536):
                if counted and self._spend(len(data)):
                    self.tripped.set()
                    self.down()
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _spend(self, n: int) -> bool:
        with self._lock:
            if self._budget is None:
                return False
            self._budget -= n
            return self._budget < 0
