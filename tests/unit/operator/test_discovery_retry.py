"""kopf's discovery scan of an optional kind's group is read again while it lacks the kind (discovery_retry.py): a
CRD whose watch events came before discovery listed it is still watched."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from duplex import discovery_retry

POOL = SimpleNamespace(group="inference.networking.k8s.io", plural="inferencepools")
WANTED = {"inference.networking.k8s.io": frozenset({"inferencepools"})}


def scans(*answers: list[Any]) -> tuple[Any, list[Any]]:
    calls: list[Any] = []
    queue = list(answers)

    async def scan(*, groups: Any = None, **kwargs: Any) -> list[Any]:
        calls.append(groups)
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return scan, calls


def test_a_scan_that_lacks_the_optional_kind_is_read_again_until_discovery_lists_it() -> None:
    scan, calls = scans([], [], [POOL])
    wrapped = discovery_retry.retrying(scan, WANTED, delays=(0, 0, 0, 0))
    assert asyncio.run(wrapped(groups={"inference.networking.k8s.io"}, settings=None, logger=None)) == [POOL]
    assert len(calls) == 3


def test_other_groups_and_full_scans_are_read_once_and_a_gone_crd_gives_up() -> None:
    scan, calls = scans([])
    wrapped = discovery_retry.retrying(scan, WANTED, delays=(0, 0))
    assert asyncio.run(wrapped(groups={"apps"}, settings=None, logger=None)) == []
    assert asyncio.run(wrapped(groups=None, settings=None, logger=None)) == []
    assert len(calls) == 2
    assert asyncio.run(wrapped(groups={"inference.networking.k8s.io"}, settings=None, logger=None)) == []
    assert len(calls) == 2 + 3  # the first read and one per delay


def test_install_wraps_kopfs_scan_once_and_knows_the_optional_kinds() -> None:
    from kopf._cogs.clients import scanning

    original = scanning.scan_resources
    try:
        discovery_retry.install()
        wrapped = scanning.scan_resources
        discovery_retry.install()
        assert scanning.scan_resources is wrapped is not original
    finally:
        scanning.scan_resources = original  # type: ignore[assignment]
    plurals = discovery_retry.optional_plurals()
    assert plurals["leaderworkerset.x-k8s.io"] == {"leaderworkersets"}
    assert plurals["inference.networking.k8s.io"] == {"inferencepools"}
