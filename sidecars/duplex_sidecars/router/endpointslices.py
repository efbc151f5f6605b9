"""Engine discovery from Kubernetes EndpointSlices: list and watch the slices of the prefill and decode headless
Services in one namespace, and report per role the URLs of the ready endpoints and of the draining ones (terminating,
still serving: a decode pod in its preStop drain, whose retained blocks the next turns still read), with the KV
revision the operator wants new work on: its label on the Service, which Kubernetes copies onto the Service's slices.

Talks to the API server with aiohttp (list, then watch from the list's resourceVersion; relist on 410 Gone or any
error) using the in-cluster service account, or a kubeconfig for tests and out-of-cluster runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import quote

import aiohttp

from duplex_sidecars.router.config import EndpointSliceDiscovery
from duplex_sidecars.router.endpoints import DECODE, PREFILL
from duplex_sidecars.tasks import cancel_all

log = logging.getLogger(__name__)

SERVICE_LABEL = "kubernetes.io/service-name"
REVISION_LABEL = "duplex.dev/kv-revision"  # on the role's Service, so on its slices: the desired KV revision
_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def slice_endpoints(slice_obj: dict[str, Any], port_name: str, scheme: str) -> tuple[list[str], list[str]]:
    """URLs of one EndpointSlice's endpoints on the named port: (ready, draining). Draining: terminating and still
    serving (the pod runs its preStop hook and passes readiness); such an endpoint takes no new work."""
    port = None
    for p in slice_obj.get("ports") or []:
        if (p.get("name") or "") == port_name and p.get("port"):
            port = p["port"]
            break
    if port is None:
        return [], []
    ready: list[str] = []
    draining: list[str] = []
    for endpoint in slice_obj.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        # The API says a missing `ready` (or `serving`) means ready (serving).
        if conditions.get("terminating") is True:
            into = draining if conditions.get("serving") is not False else None
        else:
            into = ready if conditions.get("ready") is not False else None
        if into is None:
            continue
        for address in endpoint.get("addresses") or []:
            host = f"[{address}]" if ":" in address else address
            into.append(f"{scheme}://{host}:{port}")
    return ready, draining


def slice_urls(slice_obj: dict[str, Any], port_name: str, scheme: str) -> list[str]:
    """URLs of the ready endpoints of one EndpointSlice on the named port."""
    return slice_endpoints(slice_obj, port_name, scheme)[0]


def slice_revision(slice_obj: dict[str, Any]) -> str | None:
    """The desired KV revision a slice carries (its Service's label; "" is the revision of engines from before
    revisions), or None without the label."""
    value = ((slice_obj.get("metadata") or {}).get("labels") or {}).get(REVISION_LABEL)
    return value if isinstance(value, str) else None


class _Slice(NamedTuple):
    """What the router keeps of one EndpointSlice."""

    ready: list[str]
    draining: list[str]
    revision: str | None


OnChange = Callable[[str, list[str], list[str], str | None], None]


@dataclass
class ApiAccess:
    """How to reach the API server: base URL, TLS context, and a function returning current auth headers."""

    base: str
    ssl_context: ssl.SSLContext | bool | None
    headers: Callable[[], dict[str, str]]

    @classmethod
    def in_cluster(cls) -> ApiAccess:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise RuntimeError("not in a cluster (KUBERNETES_SERVICE_HOST unset) and no kubeconfig given")
        if ":" in host:
            host = f"[{host}]"
        ctx = ssl.create_default_context(cafile=os.path.join(_SA_DIR, "ca.crt"))

        def headers() -> dict[str, str]:
            # Re-read on every (re)list: the kubelet rotates bound service-account tokens.
            with open(os.path.join(_SA_DIR, "token")) as f:
                return {"Authorization": "Bearer " + f.read().strip()}

        return cls(f"https://{host}:{port}", ctx, headers)

    @classmethod
    def from_kubeconfig(cls, path: str) -> ApiAccess:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=path, client_configuration=cfg)
        base = cfg.host.rstrip("/")
        ctx: ssl.SSLContext | bool | None = None
        if base.startswith("https"):
            if cfg.verify_ssl:
                ctx = (
                    ssl.create_default_context(cafile=cfg.ssl_ca_cert)
                    if cfg.ssl_ca_cert
                    else ssl.create_default_context()
                )
            else:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if cfg.cert_file and cfg.key_file:
                ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
        auth = {"Authorization": token if token.startswith("Bearer ") else "Bearer " + token} if token else {}
        return cls(base, ctx, lambda: dict(auth))

    @classmethod
    def for_discovery(cls, discovery: EndpointSliceDiscovery) -> ApiAccess:
        return cls.from_kubeconfig(discovery.kubeconfig) if discovery.kubeconfig else cls.in_cluster()


class _Gone(Exception):
    """The watch's resourceVersion is too old: relist."""


class EndpointSliceWatcher:
    """Keeps `on_change(role, ready_urls, draining_urls, desired_revision)` informed about the endpoints of the two
    Services."""

    def __init__(
        self,
        discovery: EndpointSliceDiscovery,
        on_change: OnChange,
        access: ApiAccess | None = None,
        watch_timeout: int = 300,
    ):
        self.discovery = discovery
        self._on_change = on_change
        self._access = access
        self._watch_timeout = watch_timeout
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self.synced = {PREFILL: False, DECODE: False}

    async def start(self) -> None:
        if self._access is None:
            self._access = ApiAccess.for_discovery(self.discovery)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                ssl=self._access.ssl_context if self._access.ssl_context is not None else True
            ),
            read_bufsize=4 * 1024 * 1024,  # one watch event is one line; a full slice is tens of KiB
        )
        loop = asyncio.get_running_loop()
        for role, service in ((PREFILL, self.discovery.prefill_service), (DECODE, self.discovery.decode_service)):
            self._tasks.append(loop.create_task(self._run(role, service)))

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _url(self) -> str:
        assert self._access is not None
        ns = quote(self.discovery.namespace, safe="")
        return f"{self._access.base}/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"

    async def _run(self, role: str, service: str) -> None:
        backoff = 0.5
        while True:
            try:
                await self._list_and_watch(role, service)
                backoff = 0.5
            except asyncio.CancelledError:
                raise
            except _Gone:
                log.info("endpointslice watch for %s expired; relisting", service)
                continue
            except Exception as exc:
                log.warning("endpointslice watch for service %s failed: %s: %s", service, type(exc).__name__, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _list_and_watch(self, role: str, service: str) -> None:
        assert self._session is not None and self._access is not None
        selector = f"{SERVICE_LABEL}={service}"
        headers = self._access.headers()
        async with self._session.get(
            self._url(),
            params={"labelSelector": selector},
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=30),
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"list endpointslices: HTTP {resp.status}: {(await resp.text())[:200]}")
            listing = await resp.json()
        slices: dict[str, _Slice] = {}
        for item in listing.get("items") or []:
            slices[item["metadata"]["name"]] = self._read(item)
        self._emit(role, slices)
        self.synced[role] = True
        version = (listing.get("metadata") or {}).get("resourceVersion", "")
        while True:
            version = await self._watch(role, service, selector, headers, slices, version)

    async def _watch(
        self,
        role: str,
        service: str,
        selector: str,
        headers: dict[str, str],
        slices: dict[str, _Slice],
        version: str,
    ) -> str:
        assert self._session is not None
        params = {
            "labelSelector": selector,
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._watch_timeout),
        }
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=self._watch_timeout + 30)
        async with self._session.get(self._url(), params=params, headers=headers, timeout=timeout) as resp:
            if resp.status == 410:
                raise _Gone()
            if resp.status != 200:
                raise RuntimeError(f"watch endpointslices: HTTP {resp.status}: {(await resp.text())[:200]}")
            async for line in resp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion", version)
                if kind == "BOOKMARK":
                    continue
                name = (obj.get("metadata") or {}).get("name")
                if not name:
                    continue
                if kind == "DELETED":
                    slices.pop(name, None)
                elif kind in ("ADDED", "MODIFIED"):
                    slices[name] = self._read(obj)
                self._emit(role, slices)
        return version

    def _read(self, slice_obj: dict[str, Any]) -> _Slice:
        ready, draining = slice_endpoints(slice_obj, self.discovery.port_name, self.discovery.scheme)
        return _Slice(ready, draining, slice_revision(slice_obj))

    def _emit(self, role: str, slices: dict[str, _Slice]) -> None:
        ready = {u for s in slices.values() for u in s.ready}
        # An address ready in one slice and draining in another (a moment of a slice update) counts as ready.
        draining = {u for s in slices.values() for u in s.draining} - ready
        self._on_change(role, sorted(ready), sorted(draining), desired_revision(slices))


def desired_revision(slices: dict[str, _Slice]) -> str | None:
    """The revision label of a role's slices. They all carry their Service's; while Kubernetes copies a changed label
    onto them one by one they may differ for a moment, and the first slice by name that has one wins."""
    return next((slices[name].revision for name in sorted(slices) if slices[name].revision is not None), None)
