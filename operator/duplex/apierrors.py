"""What a failed API request means for a reconcile pass: read from the HTTP status code and the Status object's
`reason` and `details.causes` (Kubernetes API conventions), never from the wording of its message."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The cause (Status.details.causes[].reason) the namespace lifecycle admission plugin gives for refusing new objects.
NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"
_SERVER_ERRORS = {500, 502, 503, 504}


class Failure(enum.Enum):
    TRANSIENT = "transient"  # a conflict, a server error or timeout, a lost connection: retry with backoff
    THROTTLED = "throttled"  # 429: retry, no sooner than the server asks
    NAMESPACE_TERMINATING = "namespace-terminating"  # nothing new can be created there; the namespace is going away
    NOT_FOUND = "not-found"  # the object (or its namespace) is gone
    PERMANENT = "permanent"  # invalid, forbidden, ...: retrying the same request cannot help


@dataclass(eq=False)  # not frozen: raising sets __traceback__ and friends on the instance
class ApiError(Exception):
    """A failed API request. `status` is None when no HTTP answer came back (connection refused, reset, timeout)."""

    status: int | None
    reason: str = ""  # Status.reason: Conflict, AlreadyExists, TooManyRequests, Forbidden, NotFound, Invalid, ...
    message: str = ""
    causes: tuple[str, ...] = field(default=())  # Status.details.causes[].reason (CauseType; "reason" in JSON)
    retry_after: float | None = None  # Status.details.retryAfterSeconds, or the Retry-After header

    def __str__(self) -> str:
        where = f"{self.status} {self.reason}".strip() if self.status is not None else "no response"
        return f"{where}: {self.message}" if self.message else where

    @property
    def failure(self) -> Failure:
        return classify(self.status, self.reason, self.causes)

    @classmethod
    def from_response(cls, status: int, body: str | bytes | None, headers: Mapping[str, str] | None = None) -> ApiError:
        """From an HTTP error answer whose body is (usually) a metav1.Status."""
        doc = _status_object(body)
        details = doc.get("details") or {}
        causes = tuple(str(c.get("reason") or "") for c in details.get("causes") or [])
        retry_after = details.get("retryAfterSeconds")
        header = (headers or {}).get("Retry-After")
        if retry_after is None and header is not None and header.isdigit():
            retry_after = int(header)
        return cls(
            status=status,
            reason=str(doc.get("reason") or ""),
            message=str(doc.get("message") or ""),
            causes=causes,
            retry_after=float(retry_after) if retry_after is not None else None,
        )


def classify(status: int | None, reason: str = "", causes: tuple[str, ...] = ()) -> Failure:
    if status is None or status == 409 or status in _SERVER_ERRORS:
        return Failure.TRANSIENT
    if status == 429:
        return Failure.THROTTLED
    if status == 403 and reason == "Forbidden" and NAMESPACE_TERMINATING_CAUSE in causes:
        return Failure.NAMESPACE_TERMINATING
    if status == 404:
        return Failure.NOT_FOUND
    return Failure.PERMANENT


def _status_object(body: str | bytes | None) -> dict[str, Any]:
    if not body:
        return {}
    try:
        doc = json.loads(body)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) and doc.get("kind") == "Status" else {}
