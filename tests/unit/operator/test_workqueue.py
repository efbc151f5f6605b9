"""WorkQueue: keys come out when due, earliest first; one holder per key; a key added while held comes out again
after it is released (no lost wake-up, never twice at once), not within the hold; forget drops pending wake-ups."""

from __future__ import annotations

import asyncio

import pytest

from duplex.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def queue(clock: Clock) -> WorkQueue[str]:
    return WorkQueue(clock=clock)


def test_nothing_waiting(queue: WorkQueue[str]) -> None:
    assert queue.take_due() == (None, None) and len(queue) == 0


def test_a_key_comes_out_when_due(queue: WorkQueue[str], clock: Clock) -> None:
    queue.add("a", delay=5)
    assert queue.take_due() == (None, 5)
    clock.now += 5
    assert queue.take_due() == ("a", None)
    assert queue.take_due() == (None, None)


def test_earliest_first_and_an_earlier_add_wins(queue: WorkQueue[str], clock: Clock) -> None:
    queue.add("late", delay=10)
    queue.add("soon", delay=3)
    queue.add("late", delay=1)  # sooner than it was: moves up
    queue.add("soon", delay=60)  # later than it is: ignored
    clock.now += 3
    assert queue.take_due()[0] == "late"
    assert queue.take_due()[0] == "soon"


def test_a_held_key_is_not_handed_out_again_until_done(queue: WorkQueue[str], clock: Clock) -> None:
    queue.add("a")
    assert queue.take_due()[0] == "a"
    queue.add("a")  # an event while a worker holds it
    assert queue.take_due() == (None, None)
    queue.done("a")
    assert queue.take_due() == ("a", None)


def test_done_without_new_wake_ups_leaves_nothing(queue: WorkQueue[str]) -> None:
    queue.add("a")
    queue.take_due()
    queue.done("a")
    assert queue.take_due() == (None, None)


def test_wake_ups_during_work_wait_out_the_hold(queue: WorkQueue[str], clock: Clock) -> None:
    queue.add("a")
    queue.take_due()
    queue.add("a")
    queue.done("a", hold=0.5)
    assert queue.take_due() == (None, 0.5)
    clock.now += 0.5
    assert queue.take_due()[0] == "a"


def test_a_later_wake_up_during_work_keeps_its_own_time(queue: WorkQueue[str], clock: Clock) -> None:
    queue.add("a")
    queue.take_due()
    queue.add("a", delay=30)
    queue.done("a", hold=0.5)
    assert queue.take_due() == (None, 30)


def test_forget_drops_pending_wake_ups(queue: WorkQueue[str]) -> None:
    queue.add("a", delay=1)
    queue.add("b")
    queue.take_due()  # b is held
    queue.add("b")
    queue.forget("a")
    queue.forget("b")
    queue.done("b")
    assert queue.take_due() == (None, None) and len(queue) == 0


async def test_get_waits_for_a_key_and_wakes_on_add() -> None:
    queue: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    queue.add("a")
    assert await asyncio.wait_for(getter, 1) == "a"


async def test_get_waits_until_due() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a", delay=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.wait_for(queue.get(), 1) == "a"
    assert loop.time() - started >= 0.04


async def test_two_workers_never_hold_the_same_key() -> None:
    queue: WorkQueue[str] = WorkQueue()
    holding: set[str] = set()
    clashes: list[str] = []
    passes: list[str] = []

    async def worker() -> None:
        while len(passes) < 20:
            key = await queue.get()
            if key in holding:
                clashes.append(key)
            holding.add(key)
            await asyncio.sleep(0.002)
            queue.add(key)  # its own events arrive while it works
            holding.discard(key)
            passes.append(key)
            queue.done(key)

    for key in ("a", "b"):
        queue.add(key)
    tasks = [asyncio.create_task(worker()) for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert not clashes
    assert set(passes) == {"a", "b"}
