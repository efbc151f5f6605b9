"""What the router's request path needs of one client request and its response. The HTTP/1.1 server's `Request`
(duplex_sidecars.http1.server) is one; the domain modules depend on this shape, never on the server's types."""

from __future__ import annotations

from typing import Protocol


class Exchange(Protocol):
    method: str
    path: str  # without the query
    body: bytes
    started: bool  # the response head is out
    status: int  # the response's status, once started
    keep_alive: bool

    def header(self, name: str) -> str | None:
        """A request header by case-insensitive name; repeated headers joined with ", "."""

    def repeated(self, name: str) -> bool:
        """Whether the request carried the header more than once."""

    def respond(
        self, status: int, body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        """The whole response in one write."""

    def start(self, status: int, headers: dict[str, str] | None = None, first: bytes | bytearray = b"") -> None:
        """Start a streamed response with its first data."""

    def write(self, data: bytes | bytearray) -> None: ...

    def end(self, data: bytes | bytearray = b"") -> None: ...

    async def drain(self) -> None:
        """Wait while the client reads slower than the response is written."""
