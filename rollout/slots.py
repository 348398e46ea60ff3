"""Which request runs in which KV-cache row: slots, sessions and the admission policy.

What it is: the host-side bookkeeping of `JaxEngine` (no JAX here). A `Slot` is one cache row;
it knows which tokens its row holds (`kv_tokens` when idle, `job.context[:kv_len]` when busy)
and which session, if any, owns it. `SlotTable` decides where a request goes:

1. a session's next turn goes to that session's idle slot (its cache holds the turn's prefix);
2. otherwise a free slot (no session), preferring the one whose cached tokens share the
   longest prefix with the prompt, then the least recently used;
3. otherwise the least recently used idle session slot whose hold (`session_hold_s` since its
   turn ended) has run out; that session is evicted (its next turn prefills from scratch);
4. otherwise the request waits.

Reuse is exact: KV entries depend only on (tokens, positions, weights), and the decoder masks
by position, so a row may be reused up to its common prefix with any prompt and the stale tail
is overwritten before it is ever attended to.

What it is not: thread-safe. Only the engine's scheduler thread touches it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
from typing import Sequence

from rollout.api import GenerationRequest


@dataclasses.dataclass(eq=False)
class Job:
    """One request being served; `context` is prompt + output so far."""

    request: GenerationRequest
    future: concurrent.futures.Future
    context: list[int]
    max_new: int
    stop_ids: frozenset[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=False)
class Slot:
    """One KV-cache row and what it holds."""

    index: int
    job: Job | None = None
    kv_len: int = 0  # busy: how many tokens of job.context have their k/v in the row
    kv_tokens: list[int] = dataclasses.field(default_factory=list)  # idle: the row's tokens
    session_id: str | None = None
    last_used: int = 0
    idle_since: float = 0.0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotTable:
    """The slots of one engine and the policy above (see the module docstring)."""

    def __init__(self, num_slots: int, hold_s: float):
        self.slots = [Slot(i) for i in range(num_slots)]
        self.hold_s = hold_s
        self._sessions: dict[str, Slot] = {}
        self._clock = itertools.count(1)
        self._just_finished: set[str] = set()

    def busy(self) -> list[Slot]:
        return [s for s in self.slots if s.job is not None]

    def session_slot(self, job: Job) -> Slot | None:
        """The idle slot of the job's session, if it has one."""
        session_id = job.request.session_id
        slot = self._sessions.get(session_id) if session_id is not None else None
        return slot if slot is not None and slot.job is None else None

    def pick(self, job: Job, now: float) -> tuple[Slot | None, bool]:
        """(slot for the job or None to wait, whether a session was evicted for it)."""
        own = self.session_slot(job)
        if own is not None:
            return own, False
        free = [s for s in self.slots if s.job is None and s.session_id is None]
        if free:
            return max(free, key=lambda s: (common_prefix(s.kv_tokens, job.context),
                                            -s.last_used)), False
        expired = [s for s in self.slots if s.job is None and s.idle_since + self.hold_s <= now]
        if not expired:
            return None, False
        victim = min(expired, key=lambda s: s.last_used)
        self.release(victim.session_id)
        return victim, True

    def place(self, job: Job, slot: Slot) -> int:
        """Run `job` in `slot`; returns how many prompt tokens its cache row already holds."""
        reuse = min(common_prefix(slot.kv_tokens, job.context), len(job.context) - 1)
        slot.job, slot.kv_len, slot.kv_tokens = job, reuse, []
        slot.last_used = next(self._clock)
        session_id = job.request.session_id
        if session_id is not None:
            if slot.session_id not in (None, session_id):
                self._sessions.pop(slot.session_id, None)
            previous = self._sessions.get(session_id)
            if previous is not None and previous is not slot:
                previous.session_id = None  # the session moved (its old slot was busy)
            slot.session_id = session_id
            self._sessions[session_id] = slot
        return reuse

    def finish(self, slot: Slot, now: float, continues: bool) -> Job:
        """Free a busy slot (its row keeps what was fed); `continues`: its session may send a
        next turn soon (see `take_just_finished`)."""
        job = slot.job
        slot.kv_tokens = job.context[:slot.kv_len]
        slot.job = None
        slot.last_used = next(self._clock)
        slot.idle_since = now
        if continues and slot.session_id is not None:
            self._just_finished.add(slot.session_id)
        return job

    def release(self, session_id: str | None) -> None:
        """Forget a session; its row stays as a free slot whose prefix is still reusable."""
        slot = self._sessions.pop(session_id, None) if session_id is not None else None
        if slot is not None:
            slot.session_id = None

    def invalidate(self) -> None:
        """New weights: no row holds valid k/v any more (busy rows re-prefill from 0)."""
        for slot in self.slots:
            slot.kv_len, slot.kv_tokens = 0, []

    def hold_expiry(self) -> float | None:
        """When the earliest idle session's hold runs out (None if no slot is held)."""
        held = [s.idle_since + self.hold_s for s in self.slots
                if s.job is None and s.session_id is not None]
        return min(held, default=None)

    def take_just_finished(self) -> set[str]:
        """Sessions whose turn ended since the last call."""
        sessions, self._just_finished = self._just_finished, set()
        return sessions
