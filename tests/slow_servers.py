"""Real misbehaving HTTP servers on 127.0.0.1 for deadline tests: each connection gets a valid
HTTP/1.1 response sent one byte every ``interval`` seconds, from its first byte (``phase="head"``)
or after the head (``phase="body"``) -- a client whose only limit is a per-read timeout waits for
hours.  Closing the server hangs up on every connection, so a client still waiting then gets
an error and its thread ends."""

from __future__ import annotations

import json
import socket
import threading


class TrickleServer:
    def __init__(self, phase: str = "body", interval: float = 0.5, body_bytes: int = 20_000) -> None:
        self.phase, self.interval = phase, interval
        body = json.dumps(
            {"choices": [{"message": {"content": "Score: 1"}, "finish_reason": "stop"}], "pad": "x" * body_bytes}
        ).encode()
        self.head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        self.body = body
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.stop = threading.Event()
        self.connections: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.accepted = 0
        self._accepter = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            self.connections.append(conn)
            thread = threading.Thread(target=self._trickle, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _trickle(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)  # the request (small enough for one read here)
            data = self.head + self.body
            if self.phase == "body":
                conn.sendall(self.head)
                data = self.body
            for i in range(len(data)):
                if self.stop.wait(self.interval):
                    return
                conn.sendall(data[i : i + 1])
        except OSError:
            return

    def __enter__(self) -> "TrickleServer":
        self._accepter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for conn in [self.listener, *self.connections]:  # shutdown wakes a blocked accept or recv
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        for thread in [self._accepter, *self.threads]:
            thread.join(5)


def run_bounded(fn, limit_s: float):
    """``fn()`` in a thread; (finished, result, seconds).  A call that does not finish within
    ``limit_s`` is reported unfinished (the server's close ends it afterwards)."""
    import time

    box: list = []
    started = time.monotonic()
    worker = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    worker.start()
    worker.join(limit_s)
    return bool(box), (box[0] if box else None), time.monotonic() - started
