"""The operator's Kubernetes I/O: server-side apply, label-selected lists, deletes, status and Events.

Synchronous (the `kubernetes` client); the reconcile pass runs in a worker thread.
"""

from __future__ import annotations

import datetime
import logging
import threading
import uuid
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError

from duplex.api.meta import API_VERSION, FIELD_MANAGER, KIND
from duplex.children.labels import MANAGED_BY, SERVING_LABEL

log = logging.getLogger("duplex.kube")

# Every kind the operator owns, in the order children are applied.
CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "Deployment"),
)

TRANSIENT_STATUSES = {409, 429, 500, 502, 503, 504}


class TransientError(Exception):
    """An API failure worth retrying with backoff (conflict, throttling, server errors, connection loss)."""


def load_config(kubeconfig: str | None = None) -> client.ApiClient:
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    return client.ApiClient()


def _status(err: Exception) -> int | None:
    return getattr(err, "status", None)


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self._dynamic: DynamicClient | None = None
        self._lock = threading.Lock()
        self.writes = 0  # write calls made; the tests and metrics read it

    @property
    def dynamic(self) -> DynamicClient:
        with self._lock:
            if self._dynamic is None:
                self._dynamic = DynamicClient(self.api_client)
            return self._dynamic

    def _resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ApiException, DynamicApiError) as err:
            if _status(err) in TRANSIENT_STATUSES:
                raise TransientError(f"{_status(err)}: {getattr(err, 'reason', err)}") from err
            raise
        except (OSError, ConnectionError) as err:  # urllib3 errors derive from these on connection loss
            raise TransientError(str(err)) from err
        except Exception as err:
            if type(err).__module__.startswith("urllib3"):
                raise TransientError(str(err)) from err
            raise

    def list_children(self, namespace: str, serving: str) -> list[dict[str, Any]]:
        selector = f"{SERVING_LABEL}={serving},app.kubernetes.io/managed-by={MANAGED_BY}"
        out: list[dict[str, Any]] = []
        for api_version, kind in CHILD_KINDS:
            res = self._resource(api_version, kind)
            items = self._call(res.get, namespace=namespace, label_selector=selector).to_dict().get("items") or []
            for item in items:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
            out += items
        return out

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = self._resource(obj["apiVersion"], obj["kind"])
        self.writes += 1
        result = self._call(
            self.dynamic.server_side_apply,
            res,
            body=obj,
            namespace=obj["metadata"].get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
        return result.to_dict()

    def delete(self, obj: dict[str, Any]) -> None:
        res = self._resource(obj["apiVersion"], obj["kind"])
        self.writes += 1
        try:
            self._call(
                res.delete,
                name=obj["metadata"]["name"],
                namespace=obj["metadata"].get("namespace"),
                body={"propagationPolicy": "Background"},
            )
        except NotFoundError:
            pass

    def get_parent(self, namespace: str, name: str) -> dict[str, Any] | None:
        res = self._resource(API_VERSION, KIND)
        try:
            return self._call(res.get, name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        res = self._resource(API_VERSION, KIND)
        self.writes += 1
        try:
            self._call(
                res.status.patch,
                name=name,
                namespace=namespace,
                body={"status": status},
                content_type="application/merge-patch+json",
            )
        except NotFoundError:
            log.info("%s/%s is gone; status not written", namespace, name)

    def post_event(self, parent: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = parent["metadata"]
        stamp = datetime.datetime.now(datetime.UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{meta['name']}.{uuid.uuid4().hex[:12]}", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(
                api_version=API_VERSION,
                kind=KIND,
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
                resource_version=meta.get("resourceVersion"),
            ),
            reason=reason,
            message=message[:1024],
            type=type_,
            source=client.V1EventSource(component=FIELD_MANAGER),
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=1,
            reporting_component=FIELD_MANAGER,
        )
        self.writes += 1
        try:
            self._call(client.CoreV1Api(self.api_client).create_namespaced_event, meta["namespace"], event)
        except (ApiException, TransientError) as err:  # an Event is best effort; never fail a reconcile for it
            log.warning("could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], err)
