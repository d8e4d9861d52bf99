"""uvicorn's HTTP/1.1 protocol with the limits ``sparsemm serve`` needs against abuse.

uvicorn's own ``limit_concurrency`` counts open connections, so 600 idle sockets that send
nothing make every real request a 503, and a client that trickles header bytes is never
timed out (each byte cancels the keep-alive timer). This protocol instead:

- closes a connection whose request (request line, headers and body) is not complete
  within ``header_timeout`` seconds of the connection opening or of the first byte after
  the previous response (a slow-loris client is dropped, however slowly it trickles);
- refuses connections beyond ``max_connections`` at once (closed on accept), so the open
  file descriptors stay bounded; work is bounded separately by the service's lanes;
- answers a malformed request with the API's JSON error shape (uvicorn: text/plain).

Configure it with :func:`protocol_class`; the load benchmark and ``sparsemm serve`` share it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

HEADER_TIMEOUT = 10.0  # seconds for a request head to arrive complete
MAX_CONNECTIONS = 4096  # open connections; idle ones cost a few KB each, not a search lane
MAX_HEADER_BYTES = 16 * 1024  # request line + headers (h11_max_incomplete_event_size)


class GuardedH11Protocol(H11Protocol):
    """H11Protocol plus a request-head deadline, a connection cap and JSON 400s."""

    header_timeout: float = HEADER_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            log.warning("over %d open connections: closing a new one", self.max_connections)
            transport.close()
            return
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        if self._waiting_for_head():
            self._arm_head_deadline()  # keeps an armed deadline: trickling does not extend it
        super().data_received(data)
        if not self._waiting_for_head():
            self._disarm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def _waiting_for_head(self) -> bool:
        """True between requests, while a request head is still arriving and while its
        body is (the deadline covers the whole request, so a trickled body is cut too)."""
        if self.conn.their_state is h11.SEND_BODY:
            return True
        idle = self.cycle is None or self.cycle.response_complete
        return idle and self.conn.their_state in (h11.IDLE, h11.DONE)

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is None and not self.transport.is_closing():
            self._head_deadline = self.loop.call_later(self.header_timeout, self._head_timeout)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def on_response_complete(self) -> None:
        # the next request's head has its own deadline, armed by its first byte; until
        # then uvicorn's keep-alive timeout closes an idle connection
        self._disarm_head_deadline()
        super().on_response_complete()

    def _head_timeout(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing() or not self._waiting_for_head():
            return
        log.debug("closing a connection whose request head took over %gs", self.header_timeout)
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            self._send_json_error(408, "the request head did not arrive in time")
        else:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._send_json_error(400, "malformed HTTP request; check the request line and headers")

    def _send_json_error(self, status: int, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            out = self.conn.send(h11.Response(status_code=status, headers=headers))
            out = (out or b"") + (self.conn.send(h11.Data(data=body)) or b"")
            out += self.conn.send(h11.EndOfMessage()) or b""
            self.transport.write(out)
        except h11.LocalProtocolError:  # h11 cannot answer in its state: just close
            pass
        self.transport.close()


def protocol_class(
    header_timeout: float = HEADER_TIMEOUT, max_connections: int = MAX_CONNECTIONS
) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` subclass with these limits (uvicorn's ``http=``)."""
    if header_timeout <= 0:
        raise ValueError(f"header_timeout must be positive, got {header_timeout}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections}")
    return type(
        "SparsemmH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout": float(header_timeout), "max_connections": int(max_connections)},
    )
