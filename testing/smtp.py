"""An SMTP server on loopback that keeps what it is sent: where 3.0's scheduler delivers its alert e-mails."""

from __future__ import annotations

import contextlib
import email
import socketserver
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator
    from email.message import Message


class _Session(socketserver.StreamRequestHandler):
    """One client's conversation: enough of RFC 5321 for ``smtplib.SMTP.sendmail`` without auth or TLS."""

    server: _Server

    def _reply(self, line: str) -> None:
        self.wfile.write(f"{line}\r\n".encode())

    def handle(self) -> None:
        self._reply("220 heartbeat-fix-test ESMTP")
        while line := self.rfile.readline():
            verb = line.decode(errors="replace").strip().split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                self._reply("250 heartbeat-fix-test")
            elif verb == "DATA":
                self._reply("354 end with <CRLF>.<CRLF>")
                self.server.received.append(email.message_from_bytes(self._data()))
                self._reply("250 queued")
            elif verb == "QUIT":
                self._reply("221 bye")
                return
            else:  # MAIL, RCPT, RSET, NOOP
                self._reply("250 ok")

    def _data(self) -> bytes:
        lines = []
        while (line := self.rfile.readline()) not in (b".\r\n", b""):
            lines.append(line[1:] if line.startswith(b"..") else line)
        return b"".join(lines)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Session)
        self.received: list[Message] = []


@contextlib.contextmanager
def smtp_server() -> Iterator[Any]:
    """A running server: ``.server_address[1]`` is its port, ``.received`` the messages it was sent."""
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, name="heartbeat-fix-smtp", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
