"""API failures are told apart by HTTP status, Status.reason and Status.details.causes, as the API server sends them
(the bodies below are the ones kube-apiserver 1.36 returns), never by message text."""

from __future__ import annotations

import json

import pytest

from duplex.apierrors import ApiError, Failure, classify


def status_body(code: int, reason: str, message: str, **details: object) -> str:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "details": details,
            "code": code,
        }
    )


NAMESPACE_TERMINATING = status_body(
    403,
    "Forbidden",
    'configmaps "demo-router" is forbidden: unable to create new content in namespace ns1 because it is being '
    "terminated",
    name="demo-router",
    kind="configmaps",
    causes=[
        {
            "reason": "NamespaceTerminating",
            "message": "namespace ns1 is being terminated",
            "field": "metadata.namespace",
        }
    ],
)


@pytest.mark.parametrize(
    "code,body,headers,failure",
    [
        (409, status_body(409, "Conflict", "the object has been modified"), {}, Failure.TRANSIENT),
        (409, status_body(409, "AlreadyExists", 'configmaps "x" already exists'), {}, Failure.TRANSIENT),
        (429, status_body(429, "TooManyRequests", "too many requests", retryAfterSeconds=3), {}, Failure.THROTTLED),
        (500, status_body(500, "InternalError", "etcdserver: leader changed"), {}, Failure.TRANSIENT),
        (503, "", {}, Failure.TRANSIENT),
        (504, status_body(504, "Timeout", "Timeout: request did not complete"), {}, Failure.TRANSIENT),
        (403, NAMESPACE_TERMINATING, {}, Failure.NAMESPACE_TERMINATING),
        (403, status_body(403, "Forbidden", 'User "x" cannot create resource "configmaps"'), {}, Failure.PERMANENT),
        (404, status_body(404, "NotFound", 'namespaces "ns1" not found'), {}, Failure.NOT_FOUND),
        (422, status_body(422, "Invalid", "Only one reference can have Controller set to true"), {}, Failure.PERMANENT),
        (400, "not json at all", {}, Failure.PERMANENT),
    ],
)
def test_classification(code: int, body: str, headers: dict[str, str], failure: Failure) -> None:
    assert ApiError.from_response(code, body, headers).failure is failure


def test_the_message_alone_never_decides() -> None:
    """A plain Forbidden whose message happens to say "being terminated" is still a permission problem."""
    body = status_body(403, "Forbidden", "something is being terminated")
    assert ApiError.from_response(403, body).failure is Failure.PERMANENT


def test_the_parts_of_a_status() -> None:
    err = ApiError.from_response(403, NAMESPACE_TERMINATING.encode())
    assert (err.status, err.reason, err.causes) == (403, "Forbidden", ("NamespaceTerminating",))
    assert "being terminated" in err.message and str(err).startswith("403 Forbidden: ")


def test_retry_after_from_the_status_or_the_header() -> None:
    assert ApiError.from_response(429, status_body(429, "TooManyRequests", "x", retryAfterSeconds=7)).retry_after == 7
    assert ApiError.from_response(429, "", {"Retry-After": "2"}).retry_after == 2
    assert ApiError.from_response(429, "", {}).retry_after is None


def test_no_answer_at_all_is_transient() -> None:
    err = ApiError(status=None, message="ConnectionRefusedError: [Errno 111]")
    assert err.failure is Failure.TRANSIENT and str(err).startswith("no response")
    assert classify(None) is Failure.TRANSIENT
