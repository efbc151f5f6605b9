"""A minimal HTTPS client for the few calls bring-up needs (health probes, creating nodes, checking readiness), so
starting the cluster depends on neither kubectl nor a Kubernetes client library."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    def json(self):
        return json.loads(self.body or b"null")


def _insecure_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def request(
    url: str,
    *,
    method: str = "GET",
    body: object | None = None,
    ssl_context: ssl.SSLContext | None = None,
    timeout: float = 5.0,
    content_type: str = "application/json",
) -> Response:
    """One HTTP request; HTTP error statuses come back as a Response, connection failures raise OSError."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    req.add_header("Accept", "application/json")
    if ssl_context is None and url.startswith("https://"):
        ssl_context = _insecure_context()
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_context) as resp:
            return Response(resp.status, resp.read())
    except urllib.error.HTTPError as err:
        return Response(err.code, err.read())
    except urllib.error.URLError as err:
        raise OSError(str(err.reason)) from err


def probe(url: str, timeout: float = 2.0) -> bool:
    """True when `url` answers 200 (TLS is not verified: used for loopback health endpoints only)."""
    try:
        return request(url, timeout=timeout).status == 200
    except (OSError, TimeoutError):
        return False


class APIClient:
    """The apiserver, as the admin user of the local cluster."""

    def __init__(self, server: str, ca_cert: Path, client_cert: Path, client_key: Path):
        self.server = server.rstrip("/")
        self._ctx = ssl.create_default_context(cafile=str(ca_cert))
        self._ctx.load_cert_chain(str(client_cert), str(client_key))

    def call(
        self,
        method: str,
        path: str,
        body: object | None = None,
        timeout: float = 10.0,
        content_type: str = "application/json",
    ) -> Response:
        return request(
            self.server + path,
            method=method,
            body=body,
            ssl_context=self._ctx,
            timeout=timeout,
            content_type=content_type,
        )

    def get(self, path: str, timeout: float = 10.0) -> Response:
        return self.call("GET", path, timeout=timeout)

    def ready(self) -> bool:
        try:
            resp = self.get("/readyz", timeout=3.0)
        except (OSError, TimeoutError):
            return False
        return resp.status == 200 and resp.body.strip() == b"ok"
