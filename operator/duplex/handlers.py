"""kopf handlers: thin shells that wake one reconcile loop per DisaggregatedServing.

Each parent gets a daemon that runs `reconcile_once` whenever the parent or one of its children changes, and at a
resync interval otherwise (level-triggered: the pass ignores which trigger fired).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from typing import Any

import kopf

from duplex import metrics
from duplex.api.meta import GROUP, PLURAL, VERSION
from duplex.children.labels import MANAGED_BY, SERVING_LABEL
from duplex.kube import Kube, TransientError, load_config
from duplex.reconcile import reconcile_once

log = logging.getLogger("duplex.operator")

RESYNC_SECONDS = float(os.environ.get("DUPLEX_RESYNC_SECONDS", "60"))
MAX_BACKOFF_SECONDS = 60.0
CHILD_RESOURCES = (
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("", "v1", "configmaps"),
    ("", "v1", "services"),
    ("apps", "v1", "deployments"),
)

_kube: Kube | None = None
_wakeups: dict[tuple[str, str], asyncio.Event] = {}


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube(load_config(os.environ.get("DUPLEX_KUBECONFIG") or None))
    return _kube


def _wake(namespace: str | None, name: str | None) -> None:
    event = _wakeups.get((namespace or "", name or ""))
    if event is not None:
        event.set()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """An explicit --kubeconfig wins; otherwise kopf's usual in-cluster/kubeconfig discovery."""
    path = os.environ.get("DUPLEX_KUBECONFIG")
    if not path:
        return kopf.login_via_client(**kwargs)
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=cfg)
    token = (cfg.api_key or {}).get("authorization", "").removeprefix("Bearer ").strip() or None
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
    )


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.error_backoffs = [1, 2, 4, 8, 15]
    settings.peering.standalone = True
    kube()  # fail fast on a bad kubeconfig


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def serve(name: str, namespace: str, body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
    key = (namespace, name)
    wakeup = _wakeups.setdefault(key, asyncio.Event())
    metrics.SERVINGS.inc()
    backoff = 1.0
    try:
        while not stopped:
            wakeup.clear()
            parent = copy.deepcopy({k: body[k] for k in body})  # body is a live view; reconcile a snapshot
            try:
                await asyncio.to_thread(reconcile_once, kube(), parent)
                delay, backoff = RESYNC_SECONDS, 1.0
            except TransientError as err:
                metrics.RECONCILE_ERRORS.labels("transient").inc()
                log.warning("%s/%s: transient API error, retrying in %.0fs: %s", namespace, name, backoff, err)
                delay, backoff = backoff, min(backoff * 2, MAX_BACKOFF_SECONDS)
            except Exception as err:  # never let one bad pass kill the loop
                if "is being terminated" in str(err):
                    log.info("%s/%s: namespace is terminating; nothing to converge", namespace, name)
                    delay = RESYNC_SECONDS
                else:
                    metrics.RECONCILE_ERRORS.labels("unexpected").inc()
                    log.exception("%s/%s: reconcile failed, retrying in %.0fs", namespace, name, backoff)
                    delay, backoff = backoff, min(backoff * 2, MAX_BACKOFF_SECONDS)
            await _sleep_or_wake(wakeup, delay)
    finally:
        metrics.SERVINGS.dec()
        _wakeups.pop(key, None)


async def _sleep_or_wake(wakeup: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(wakeup.wait(), timeout=seconds)
    except TimeoutError:
        pass


@kopf.on.event(GROUP, VERSION, PLURAL)
def parent_changed(name: str, namespace: str, **_: Any) -> None:
    _wake(namespace, name)


def _child_changed(namespace: str, labels: dict[str, str], **_: Any) -> None:
    _wake(namespace, labels.get(SERVING_LABEL))


for _group, _version, _plural in CHILD_RESOURCES:
    kopf.on.event(_group, _version, _plural, labels={"app.kubernetes.io/managed-by": MANAGED_BY})(_child_changed)
