"""Kube.post_event: a repeat of an Event posted lately is counted on that Event (a merge patch of its count and
lastTimestamp), as client-go's recorder does, rather than posted anew; a repeat of one that is gone is posted again.
The API is a stand-in for Kube._request."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from duplex.apierrors import ApiError
from duplex.event_cache import WINDOW_SECONDS, EventCache
from duplex.kube import Kube

PARENT = {"metadata": {"name": "demo", "namespace": "ns1", "uid": "uid-1", "resourceVersion": "5"}}
EVENTS = "/api/v1/namespaces/ns1/events"
MERGE = "application/merge-patch+json"


class FakeApi:
    """Answers Kube._request: records each request; a PATCH of an Event named in `gone` is a 404, a request whose
    method is in `fail` a 500."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any, str]] = []
        self.gone: set[str] = set()
        self.fail: set[str] = set()
        self._lock = threading.Lock()

    def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            self.requests.append((method, path, body, content_type))
        if method in self.fail:
            raise ApiError(status=500, reason="InternalError")
        if method == "PATCH" and path.rsplit("/", 1)[1] in self.gone:
            raise ApiError(status=404, reason="NotFound")
        return dict(body or {})

    def posted(self) -> list[dict[str, Any]]:
        return [body for method, _, body, _ in self.requests if method == "POST"]


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> Kube:
    kube = Kube(None)  # type: ignore[arg-type]  # no API client: every request goes to the FakeApi
    monkeypatch.setattr(kube, "_request", FakeApi())
    return kube


def api(kube: Kube) -> FakeApi:
    fake = kube._request
    assert isinstance(fake, FakeApi)
    return fake


def test_the_first_event_is_posted_and_its_repeats_counted_on_it(kube: Kube) -> None:
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
    ((method, path, event, _),) = api(kube).requests
    assert (method, path) == ("POST", EVENTS)
    name = event["metadata"]["name"]
    assert name.startswith("demo.") and event["count"] == 1
    assert event["firstTimestamp"] == event["lastTimestamp"]
    assert (event["involvedObject"]["uid"], event["type"], event["reason"]) == ("uid-1", "Warning", "ExtensionMissing")
    for count in (2, 3):
        kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
        method, path, body, content_type = api(kube).requests[-1]
        assert (method, path, content_type) == ("PATCH", f"{EVENTS}/{name}", MERGE)
        assert set(body) == {"count", "lastTimestamp"} and body["count"] == count
    assert len(api(kube).posted()) == 1


def test_another_message_reason_type_or_object_is_an_event_of_its_own(kube: Kube) -> None:
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no LeaderWorkerSets")
    kube.post_event(PARENT, "Warning", "NotReady", "no pools")
    kube.post_event(PARENT, "Normal", "ExtensionMissing", "no pools")
    other = {"metadata": {**PARENT["metadata"], "uid": "uid-2"}}
    kube.post_event(other, "Warning", "ExtensionMissing", "no pools")
    posted = api(kube).posted()
    assert len(posted) == 5 and len({e["metadata"]["name"] for e in posted}) == 5
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")  # the first one's repeat, all the same
    method, path, body, _ = api(kube).requests[-1]
    assert (method, path, body["count"]) == ("PATCH", f"{EVENTS}/{posted[0]['metadata']['name']}", 2)


def test_a_repeat_of_an_event_that_is_gone_is_posted_anew(kube: Kube) -> None:
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
    (first,) = api(kube).posted()
    api(kube).gone.add(first["metadata"]["name"])  # expired (the Events' TTL) or deleted
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
    assert [m for m, *_ in api(kube).requests] == ["POST", "PATCH", "POST"]
    second = api(kube).posted()[1]
    assert second["metadata"]["name"] != first["metadata"]["name"] and second["count"] == 1
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")  # and its repeats counted on the new one
    method, path, body, _ = api(kube).requests[-1]
    assert (method, path, body["count"]) == ("PATCH", f"{EVENTS}/{second['metadata']['name']}", 2)


def test_a_repeat_after_the_window_is_a_new_event(kube: Kube) -> None:
    now = [0.0]
    kube.events = EventCache(clock=lambda: now[0])
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
    now[0] += WINDOW_SECONDS - 1
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")  # counted: the window runs from the last one
    now[0] += WINDOW_SECONDS - 1
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
    now[0] += WINDOW_SECONDS
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
    assert [m for m, *_ in api(kube).requests] == ["POST", "PATCH", "PATCH", "POST"]


def test_a_failed_write_never_fails_the_pass(kube: Kube) -> None:
    api(kube).fail = {"POST", "PATCH"}
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
    kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")
    assert [m for m, *_ in api(kube).requests] == ["POST", "PATCH"]


def test_the_cache_is_bounded_and_forgets_the_least_recently_posted() -> None:
    cache = EventCache(size=2)
    a, b, c = (("uid-1", "Warning", "R", m) for m in "abc")
    cache.observe(a, "ev-a", "t0")
    cache.observe(b, "ev-b", "t0")
    assert cache.observe(a, "ev-a2", "t1").count == 2  # a is now the most recent
    cache.observe(c, "ev-c", "t1")  # b goes
    assert (cache.observe(a, "x", "t2").count, cache.observe(b, "ev-b2", "t2").name) == (3, "ev-b2")


def test_repeats_from_many_threads_each_take_their_own_count(kube: Kube) -> None:
    def post() -> None:
        for _ in range(50):
            kube.post_event(PARENT, "Warning", "ExtensionMissing", "no pools")

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = sorted(body["count"] for method, _, body, _ in api(kube).requests if method == "PATCH")
    assert len(api(kube).posted()) == 1 and counts == list(range(2, 201))
