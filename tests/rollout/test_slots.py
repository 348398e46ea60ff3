"""SlotTable: where a request runs, on hand-built cases (no JAX).

Run: .venv/bin/python -m pytest tests/rollout/test_slots.py -q
"""

import concurrent.futures

from rollout.api import GenerationRequest, SamplingParams
from rollout.slots import Job, SlotTable


def job(prompt, session=None):
    request = GenerationRequest("r", tuple(prompt), SamplingParams(), session_id=session)
    return Job(request, concurrent.futures.Future(), list(prompt), 8, frozenset())


def run_and_finish(table, j, now=0.0):
    slot, _ = table.pick(j, now)
    reuse = table.place(j, slot)
    j.context += [99]  # one sampled token, never fed
    slot.kv_len = len(j.context) - 1
    table.finish(slot, now, continues=True)
    return slot, reuse


def test_free_slot_with_longest_common_prefix_wins_and_reuse_stops_before_the_last_token():
    table = SlotTable(3, hold_s=1.0)
    a, _ = run_and_finish(table, job([1, 2, 3, 4]))
    b, _ = run_and_finish(table, job([5, 6]))  # shares nothing: takes a never-used slot
    assert b is not a
    # Lands on b's row, which holds [5, 6]: b's sampled 99 was never fed.
    assert run_and_finish(table, job([5, 6, 99, 7])) == (b, 2)
    slot, evicted = table.pick(job([1, 2, 3, 4, 5]), 0.0)
    assert slot is a and not evicted
    assert table.place(job([1, 2, 3, 4]), a) == 3  # whole prompt cached: refeed the last one


def test_session_keeps_its_slot_until_the_hold_runs_out():
    table = SlotTable(1, hold_s=1.0)
    mine, _ = run_and_finish(table, job([1, 2, 3], session="s"), now=10.0)
    nxt = job([1, 2, 3, 99, 5], session="s")
    assert table.session_slot(nxt) is mine
    assert table.take_just_finished() == {"s"} and table.take_just_finished() == set()
    other = job([8, 9])
    assert table.pick(other, now=10.5) == (None, False)  # held for its next turn
    assert table.hold_expiry() == 11.0
    assert table.pick(other, now=11.0) == (mine, True)  # hold over: evicted
    assert table.session_slot(nxt) is None


def test_released_session_slot_is_free_and_keeps_its_prefix():
    table = SlotTable(1, hold_s=100.0)
    slot, _ = run_and_finish(table, job([1, 2, 3], session="s"))
    table.release("s")
    assert table.pick(job([1, 2, 3, 99, 4]), 0.0) == (slot, False)
    table.invalidate()
    assert table.place(job([1, 2, 3, 99, 4]), slot) == 0  # new weights: nothing reusable
