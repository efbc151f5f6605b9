"""The operator's writes to the API server: server-side apply and delete of children, the parent's status, Events.

Reads never come through here: observed state is what kopf's watch streams deliver (see handlers.py). Paths come
from the child-kind table, so no discovery requests are made. Synchronous (the `kubernetes` client's REST layer);
the workers run a pass in a thread. Every failure is raised as an `ApiError`.
"""

from __future__ import annotations

import datetime
import json
import logging
import uuid
from typing import Any

import urllib3
from kubernetes import client, config

from duplex.api.meta import API_VERSION, FIELD_MANAGER, GROUP, KIND, PLURAL, VERSION
from duplex.apierrors import ApiError, Failure
from duplex.children.kinds import POD, ChildKind, kind_of
from duplex.event_cache import EventCache, Posted

log = logging.getLogger("duplex.kube")

REQUEST_TIMEOUT = (10.0, 60.0)  # connect, read (seconds)


def load_config(kubeconfig: str | None = None, connections: int = 10) -> client.ApiClient:
    """The API client, keeping up to `connections` connections open (one per reconcile worker): past the pool's size
    urllib3 opens and drops a connection per request, a TLS handshake each time."""
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, connections)
    return client.ApiClient(cfg)


def object_path(kind: ChildKind, namespace: str, name: str) -> str:
    prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
    scope = f"/namespaces/{namespace}" if kind.namespaced else ""
    return f"{prefix}{scope}/{kind.plural}/{name}"


def _child_path(obj: dict[str, Any]) -> str:
    kind = kind_of(obj)
    if kind is None:
        raise ValueError(f"{obj.get('apiVersion')} {obj.get('kind')} is not a child kind")
    meta = obj["metadata"]
    return object_path(kind, meta.get("namespace", ""), meta["name"])


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.events = EventCache()  # the Events posted lately, to count their repeats

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        try:
            method, url, headers, body, _ = self.api_client.param_serialize(
                method, path, query_params=query, header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            response = self.api_client.call_api(
                method, url, header_params=headers, body=body, _request_timeout=REQUEST_TIMEOUT
            )
            data = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as err:  # refused, reset, timed out: no HTTP answer
            raise ApiError(status=None, message=f"{type(err).__name__}: {err}") from err
        except client.ApiException as err:  # the REST layer's own failures (TLS), also without an HTTP answer
            raise ApiError(status=None, message=str(err.reason)) from err
        if not 200 <= response.status < 300:
            raise ApiError.from_response(response.status, data, response.headers)
        return json.loads(data) if data else {}

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply as the operator's field manager; the API's answer is the object as stored."""
        return self._request(
            "PATCH",
            _child_path(obj),
            body=obj,
            content_type="application/apply-patch+yaml",  # JSON is YAML
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )

    def hand_over(self, obj: dict[str, Any], manager: str) -> dict[str, Any]:
        """Server-side apply of a few fields as another field manager, without force: a value someone changed
        meanwhile is a Conflict (the pass retries on what the watch brings), never overwritten."""
        return self._request(
            "PATCH",
            _child_path(obj),
            body=obj,
            content_type="application/apply-patch+yaml",
            query=[("fieldManager", manager)],
        )

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """POST a new child (AlreadyExists if it exists): for children that must never be changed once made."""
        path = _child_path(obj).rsplit("/", 1)[0]
        return self._request("POST", path, body=obj, query=[("fieldManager", FIELD_MANAGER)])

    def get(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """A child as stored, or None if there is none."""
        try:
            return self._request("GET", _child_path(obj))
        except ApiError as err:
            if err.failure is not Failure.NOT_FOUND:
                raise
            return None

    def delete(self, obj: dict[str, Any]) -> None:
        """Delete a child; its own children (pods, ReplicaSets) go in the background. Already gone is fine."""
        try:
            self._request("DELETE", _child_path(obj), body={"propagationPolicy": "Background"})
        except ApiError as err:
            if err.failure is not Failure.NOT_FOUND:
                raise

    def annotate_pod(self, pod: dict[str, Any]) -> None:
        """Merge-patch a pod's annotations (scale_in.py's deletion costs). A pod already gone is fine."""
        meta = pod["metadata"]
        path = object_path(POD, meta["namespace"], meta["name"])
        try:
            body = {"metadata": {"annotations": meta["annotations"]}}
            self._request("PATCH", path, body=body, content_type="application/merge-patch+json")
        except ApiError as err:
            if err.failure is not Failure.NOT_FOUND:
                raise

    def patch_pod_status(self, pod: dict[str, Any]) -> None:
        """Strategic-merge a pod's status conditions (merged by type: lockstep.py's readiness gate). A pod already
        gone is fine."""
        meta = pod["metadata"]
        path = object_path(POD, meta["namespace"], meta["name"]) + "/status"
        try:
            body = {"status": pod["status"]}
            self._request("PATCH", path, body=body, content_type="application/strategic-merge-patch+json")
        except ApiError as err:
            if err.failure is not Failure.NOT_FOUND:
                raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the parent's status; the parent as stored, or None if it is gone."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        try:
            return self._request("PATCH", path, body={"status": status}, content_type="application/merge-patch+json")
        except ApiError as err:
            if err.failure is not Failure.NOT_FOUND:
                raise
            log.info("%s/%s is gone; status not written", namespace, name)
            return None

    def post_event(self, parent: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event on the parent; best effort: a pass never fails for an Event. A repeat of an Event posted
        lately (same type, reason and message) is counted on that Event rather than posted anew (event_cache.py)."""
        meta = parent["metadata"]
        message = message[:1024]
        key = (meta["uid"], type_, reason, message)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        name = f"{meta['name']}.{uuid.uuid4().hex[:12]}"
        try:
            seen = self.events.observe(key, name, stamp)
            if seen.count > 1:
                if self._count_again(meta["namespace"], seen, stamp):
                    return
                seen = self.events.restart(key, name, stamp)
            self._create_event(meta, type_, reason, message, seen)
        except ApiError as err:
            quiet = err.failure in (Failure.NAMESPACE_TERMINATING, Failure.NOT_FOUND)  # the parent goes with it
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "could not post event %s on %s/%s: %s",
                reason,
                meta["namespace"],
                meta["name"],
                err,
            )

    def _count_again(self, namespace: str, seen: Posted, stamp: str) -> bool:
        """Write a repeat's count on the Event it repeats; False if that Event is gone (expired or deleted)."""
        path = f"/api/v1/namespaces/{namespace}/events/{seen.name}"
        body = {"count": seen.count, "lastTimestamp": stamp}
        try:
            self._request("PATCH", path, body=body, content_type="application/merge-patch+json")
        except ApiError as err:
            if err.failure is not Failure.NOT_FOUND:
                raise
            return False
        return True

    def _create_event(self, meta: dict[str, Any], type_: str, reason: str, message: str, new: Posted) -> None:
        """POST a new Event on the parent, as `new` names and dates it."""
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": new.name, "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                **({"resourceVersion": meta["resourceVersion"]} if meta.get("resourceVersion") else {}),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": FIELD_MANAGER},
            "firstTimestamp": new.first,
            "lastTimestamp": new.first,
            "count": new.count,
            "reportingComponent": FIELD_MANAGER,
        }
        self._request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", body=event)
