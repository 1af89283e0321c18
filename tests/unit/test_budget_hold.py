"""Bytes held in the prefetch budget after their reads (``ByteBudget.hold``): the indexed
engine's chunks count from before their reads until the consumer is done with their records
(issue 29, B.9), beside the reads in flight, and never stall a read."""

from __future__ import annotations

import asyncio

from streamrec.pipeline.budget import ByteBudget


async def test_a_hold_waits_for_room_beside_what_is_held() -> None:
    budget = ByteBudget(100)
    await budget.hold(60)  # the consumer's chunk
    second = asyncio.ensure_future(budget.hold(60))  # the next one: does not fit beside it
    await asyncio.sleep(0)
    assert not second.done() and budget.reserved == 60
    budget.unhold(60)  # the consumer asked for the next piece
    await second
    assert (budget.reserved, budget.held, budget.peak) == (60, 60, 60)


async def test_a_hold_larger_than_the_budget_is_granted_alone() -> None:
    budget = ByteBudget(100)
    await budget.hold(250)  # one record larger than the budget: a chunk alone
    assert budget.reserved == 250 and budget.held == 250
    budget.unhold(250)
    assert budget.reserved == 0 and budget.held == 0


async def test_reads_get_the_room_left_beside_held_bytes_and_one_alone() -> None:
    budget = ByteBudget(100)
    await budget.hold(70)
    assert budget.try_reserve(30)  # fits beside what is held
    assert not budget.try_reserve(10)  # a read in flight: no room beyond the limit
    budget.release(30)
    # no read in flight: one is granted even beyond the limit, so the chunk whose records
    # are held can always finish its reads (held bytes never stall a read)
    assert budget.try_reserve(90)
    assert budget.reserved == 160 and budget.peak == 160
    budget.release(90)
    budget.unhold(70)
    assert budget.reserved == 0
