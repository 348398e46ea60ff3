"""JaxEngine: the embedded sampler of a rollout worker (continuous batching over a KV cache).

What it is: a fixed number of slots, each owning one row of a preallocated KV cache
[layers, slots, max_seq_len, kv_heads, head_dim]. One background scheduler thread loops:

    apply session releases, aborts and a pending weight switch
    admit waiting requests into slots (a session's next turn first, then FIFO)
    prefill rows with more than `fold_prefill_tokens` unfed tokens (grouped by prefill
        bucket, chunked past the last one)
    decode every other busy row, `decode_steps_per_call` steps in one call; a row's few unfed
        tokens (a turn continuation) are fed first inside those steps, at no extra call
    hand finished generations to their futures

A finished sequence frees its slot, and the next waiting request takes it at the next loop, so
turns of different lengths keep the batch full. The compiled steps live in
`rollout/engine_steps.py` (pure functions, `jax.jit` once per shape bucket).

Multi-turn KV reuse (`rollout/slots.py`): every slot remembers which tokens its cache row
holds. A request is placed in the slot of its `session_id` when it has one, otherwise in the
free slot sharing the longest prefix with its prompt; only tokens past that common prefix are
fed (at least one, to get logits). A session keeps its slot until `release_session`, or until
its hold (`session_hold_s` after its turn ended) runs out and a waiting request evicts it. A weight switch invalidates every cached row, because KV computed by old weights
would make new tokens that the new weights would not have made.

Behaviour logprobs (what the learner's importance ratios compare against): for temperature
T > 0, log softmax(logits / T)[token], the temperature-scaled distribution before top-k/top-p
truncation, exactly `model.decoder.token_logprobs(..., temperature=T)` on the same weights;
for greedy (T == 0) the temperature-1 logprob log softmax(logits)[token]. See
`rollout/sampling.py`.

Weights: `load_weights(WeightVersion)` reads the snapshot (`model.weights.load_snapshot`, which
checks the digest) on the caller's thread; a corrupt snapshot raises and the engine keeps
serving what it had. Versions only go up. The switch happens between two compiled calls:
- drain (default): no new request is admitted until those in flight finish on their version;
- `interrupt_on_update=True`: the switch happens at once; each in-flight request re-prefills its
  context under the new weights and continues, so its tokens carry two versions.

What it is not: a paged-attention server. Cache rows are contiguous and fixed-length; groups
that share a prompt do not share cache memory (they reuse it only when they land in a slot that
held it); there is no speculative decoding.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from model.config import ModelConfig
from model.decoder import init_cache
from model.weights import WeightVersion, load_snapshot
from rollout import engine_steps
from rollout.api import EngineError, FinishReason, Generation, GenerationRequest
from rollout.config import JaxEngineConfig
from rollout.slots import Job, Slot, SlotTable

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Update:
    version: int
    digest: str
    params: Any
    applied: threading.Event = dataclasses.field(default_factory=threading.Event)


def _cast_params(params: Any, dtype: str) -> Any:
    return jax.tree.map(lambda x: jnp.asarray(x, dtype), params)


class JaxEngine:
    """Continuous-batching sampler on the local JAX devices (implements `rollout.api.Engine`)."""

    name = "jax"

    def __init__(self, model_config: ModelConfig, params: Any,
                 config: JaxEngineConfig = JaxEngineConfig(), *, version: int = 0,
                 digest: str = "", decode: Callable[[Sequence[int]], str] | None = None):
        """`decode` turns token ids into text; it is needed only for stop strings."""
        self.config = config
        self.model_config = dataclasses.replace(model_config, dtype=config.dtype)
        self._decode_text = decode
        # Snapshots hold float32 params of this shape; served params are cast to config.dtype.
        self._structure = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), np.float32), params)
        self._params = _cast_params(params, config.dtype)
        self._version = int(version)
        self._digest = digest
        self._cache = init_cache(self.model_config, config.slots, config.max_seq_len)
        self._table = SlotTable(config.slots, config.session_hold_s)
        self._slots = self._table.slots
        self._queue: collections.deque[Job] = collections.deque()
        # Decode attends over a power-of-two prefix of each cache row (>= 128 slots).
        self._length_buckets = [b for b in (1 << i for i in range(7, 31))
                                if b < config.max_seq_len] + [config.max_seq_len]
        # Prefill row counts compile as powers of 4 (and all slots): few shapes, <4x padding.
        self._row_buckets = [4 ** i for i in range(config.slots.bit_length())
                             if 4 ** i < config.slots] + [config.slots]
        # Shared with callers, guarded by _cond.
        self._cond = threading.Condition()
        self._incoming: list[Job] = []
        self._aborts: set[str] = set()
        self._releases: list[str] = []
        self._warmups: list[threading.Event] = []
        self._update: _Update | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._update_lock = threading.Lock()
        self.stats = collections.Counter()  # generated/prefill/reused tokens, calls; read-only outside
        self._thread = threading.Thread(target=self._run, name="jax-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_hf_dir(cls, folder: str, config: JaxEngineConfig = JaxEngineConfig(), *,
                    version: int = 0) -> JaxEngine:
        """Serve a HF folder (config.json, safetensors, tokenizer) as `version`."""
        from model.hf_io import load_hf
        from model.tokenizer import Tokenizer

        model_config, params = load_hf(folder, dtype=config.dtype)
        tokenizer = Tokenizer.from_dir(folder)
        return cls(model_config, params, config, version=version, decode=tokenizer.decode)

    # ------------------------------------------------------------------ public API

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        """Longest prompt + output one request may reach (tokens)."""
        return self.config.max_seq_len

    @property
    def healthy(self) -> bool:
        return self._error is None and not self._closed and self._thread.is_alive()

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
        """Queue one request; the future resolves to its `Generation` (or EngineError)."""
        job = self._validate(request)
        with self._cond:
            if self._error is not None or self._closed:
                raise EngineError(f"JaxEngine is not serving: {self._error or 'closed'}")
            self._incoming.append(job)
            self._cond.notify_all()
        return job.future

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Sample every request to completion; order matches input."""
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def warmup(self) -> float:
        """Compile every shape (each prefill row count x bucket, and decode) now, on the
        scheduler thread, so no request waits for a compile later; returns seconds."""
        start = time.perf_counter()
        done = threading.Event()
        with self._cond:
            self._raise_if_dead()
            self._warmups.append(done)
            self._cond.notify_all()
        while not done.wait(0.05):
            with self._cond:
                self._raise_if_dead()
        logger.info("JaxEngine compiled %d prefill shapes and decode in %.1fs",
                    len(self._row_buckets) * len(self.config.prefill_buckets),
                    time.perf_counter() - start)
        return time.perf_counter() - start

    def abort(self, request_ids: Sequence[str]) -> None:
        """Finish these requests now with FinishReason.ABORT (tokens so far are returned)."""
        with self._cond:
            self._aborts.update(request_ids)
            self._cond.notify_all()

    def release_session(self, session_id: str) -> None:
        """Forget a session; its cache row becomes an ordinary free slot (its prefix stays reusable)."""
        with self._cond:
            self._releases.append(session_id)
            self._cond.notify_all()

    def load_weights(self, version: WeightVersion) -> float:
        """Load `version`, verify its digest, switch atomically; returns seconds spent.

        The same version again is a no-op; a lower one raises ValueError."""
        start = time.perf_counter()
        with self._update_lock:
            if version.version < self._version:
                raise ValueError(f"JaxEngine.load_weights version must not go down: serving "
                                 f"{self._version}, got {version.version}")
            if version.version == self._version:
                if version.digest and self._digest and version.digest != self._digest:
                    raise ValueError(f"JaxEngine.load_weights got version {version.version} "
                                     f"again with a different digest")
                return time.perf_counter() - start
            # Raises SnapshotDigestError / SnapshotError; the served weights stay untouched.
            params = load_snapshot(version, expected_structure=self._structure)
            update = _Update(version.version, version.digest,
                             _cast_params(params, self.config.dtype))
            jax.block_until_ready(update.params)
            with self._cond:
                self._raise_if_dead()
                self._update = update
                self._cond.notify_all()
            deadline = time.monotonic() + self.config.update_timeout_s
            while not update.applied.wait(0.05):
                with self._cond:
                    self._raise_if_dead()
                    if time.monotonic() > deadline and self._update is update:
                        self._update = None
                        raise TimeoutError(f"JaxEngine did not switch to version "
                                           f"{version.version} within update_timeout_s="
                                           f"{self.config.update_timeout_s}")
        logger.info("serving weight version %d (%.2fs)", version.version,
                    time.perf_counter() - start)
        return time.perf_counter() - start

    def close(self) -> None:
        """Stop the scheduler; unfinished requests fail with EngineError."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def __enter__(self) -> JaxEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ validation

    def _validate(self, request: GenerationRequest) -> Job:
        s, c = request.sampling, self.config
        prompt = [int(t) for t in request.prompt_ids]
        if not prompt:
            raise ValueError(f"GenerationRequest.prompt_ids must be non-empty "
                             f"(request {request.request_id!r})")
        if len(prompt) >= c.max_seq_len:
            raise ValueError(f"GenerationRequest.prompt_ids must be shorter than max_seq_len="
                             f"{c.max_seq_len}, got {len(prompt)} tokens "
                             f"(request {request.request_id!r})")
        vocab = self.model_config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"GenerationRequest.prompt_ids must lie in [0, {vocab}), got "
                             f"min {min(prompt)} max {max(prompt)}")
        if len(set(s.stop_token_ids)) > c.max_stop_ids:
            raise ValueError(f"SamplingParams.stop_token_ids must hold at most max_stop_ids="
                             f"{c.max_stop_ids} ids, got {len(set(s.stop_token_ids))}")
        if s.stop_strings and self._decode_text is None:
            raise ValueError("SamplingParams.stop_strings need an engine built with a decode "
                             "function (JaxEngine(..., decode=tokenizer.decode))")
        if s.max_new_tokens <= 0 or s.temperature < 0 or not 0 < s.top_p <= 1 or s.top_k < 0:
            raise ValueError(f"SamplingParams must have max_new_tokens > 0, temperature >= 0, "
                             f"0 < top_p <= 1, top_k >= 0, got {s}")
        return Job(request, concurrent.futures.Future(), prompt, s.max_new_tokens,
                    frozenset(s.stop_token_ids))

    def _raise_if_dead(self) -> None:
        if self._error is not None or self._closed:
            raise EngineError(f"JaxEngine is not serving: {self._error or 'closed'}")

    # ------------------------------------------------------------------ scheduler

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._closed and not self._has_work_locked():
                        # Queued requests wait for a held session slot to expire at the latest.
                        timeout = None
                        wake = self._hold_expiry() if self._update is None else None
                        if wake is not None:
                            timeout = wake - time.monotonic()
                            if timeout <= 0:
                                break
                        self._cond.wait(timeout)
                    if self._closed:
                        break
                    self._await_continuations_locked()
                    self._queue.extend(self._incoming)
                    self._incoming.clear()
                    aborts, self._aborts = self._aborts, set()
                    releases, self._releases = self._releases, []
                    warmups, self._warmups = self._warmups, []
                    update = self._update
                if warmups:
                    self._compile_all()
                    for done in warmups:
                        done.set()
                for session_id in releases:
                    self._table.release(session_id)
                if aborts:
                    self._abort(aborts)
                if update is not None:
                    self._maybe_switch(update)
                self._admit(draining=self._update is not None)
                self._prefill()
                self._decode()
        except BaseException as exc:  # noqa: BLE001 - the thread must report, not vanish
            logger.exception("JaxEngine scheduler failed")
            with self._cond:
                self._error = exc
        self._fail_all(EngineError(f"JaxEngine stopped: {self._error or 'closed'}"))

    def _await_continuations_locked(self) -> None:
        """Sessions whose turn just ended usually send their next turn within a millisecond
        (parse, a fast tool, encode). Waiting that long before the next decode call lets their
        rows join it instead of idling through it (`continuation_grace_s`)."""
        waiting = self._table.take_just_finished()
        if not waiting or self.config.continuation_grace_s <= 0:
            return
        deadline = time.monotonic() + self.config.continuation_grace_s
        while True:
            arrived = {job.request.session_id for job in self._incoming}
            remaining = deadline - time.monotonic()
            if waiting <= arrived or remaining <= 0 or self._closed:
                return
            self._cond.wait(remaining)

    def _has_work_locked(self) -> bool:
        return bool(self._incoming or self._aborts or self._releases or self._warmups
                    or self._update or any(s.job is not None for s in self._slots))

    def _fail_all(self, error: EngineError) -> None:
        with self._cond:
            jobs = list(self._queue) + self._incoming + [s.job for s in self._slots if s.job]
            self._queue.clear()
            self._incoming.clear()
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(error)

    def _abort(self, request_ids: set[str]) -> None:
        kept = collections.deque()
        for job in self._queue:
            if job.request.request_id in request_ids:
                self._resolve(job, FinishReason.ABORT)
            else:
                kept.append(job)
        self._queue = kept
        for slot in self._slots:
            if slot.job is not None and slot.job.request.request_id in request_ids:
                self._finish(slot, FinishReason.ABORT)

    def _maybe_switch(self, update: _Update) -> None:
        busy = [s for s in self._slots if s.job is not None]
        if busy and not self.config.interrupt_on_update:
            return  # drain: wait until in-flight requests finish on their version
        self._params, self._version, self._digest = update.params, update.version, update.digest
        self._table.invalidate()  # busy rows re-prefill under the new weights
        with self._cond:
            if self._update is update:
                self._update = None
        update.applied.set()
        self.stats["weight_switches"] += 1

    def _admit(self, draining: bool) -> None:
        """Place queued requests in slots (policy: `rollout/slots.py`): a session's next turn
        first (its slot is waiting for it), then the rest in FIFO order."""
        if draining or not self._queue:
            return
        waiting = [job for job in self._queue if not job.future.cancelled()]
        self._queue.clear()
        continuations = [job for job in waiting if self._table.session_slot(job) is not None]
        others = [job for job in waiting if self._table.session_slot(job) is None]
        blocked = False
        for job in continuations + others:
            slot, evicted = (None, False) if blocked else self._table.pick(job, time.monotonic())
            if slot is None:
                blocked = True  # FIFO: later requests must not overtake this one
                self._queue.append(job)
                continue
            self.stats["evicted_sessions"] += evicted
            if not job.future.set_running_or_notify_cancel():
                continue  # cancelled just now
            self.stats["reused_tokens"] += self._table.place(job, slot)
            self.stats["requests"] += 1

    def _hold_expiry(self) -> float | None:
        """When queued requests may next evict an idle session's slot (None: nothing queued)."""
        return self._table.hold_expiry() if self._queue else None

    # ------------------------------------------------------------------ compiled calls

    def _sampling_row(self, job: Job) -> tuple[float, float, int, int, int]:
        s = job.request.sampling
        return (s.temperature, s.top_p, s.top_k, s.seed % (1 << 32), len(job.tokens))

    @staticmethod
    def _sampling_columns(sampling: np.ndarray) -> tuple[np.ndarray, ...]:
        """[rows, 5] (temperature, top_p, top_k, seed, step) -> the compiled steps' dtypes."""
        return (sampling[:, 0].astype(np.float32), sampling[:, 1].astype(np.float32),
                sampling[:, 2].astype(np.int32), sampling[:, 3].astype(np.uint32),
                sampling[:, 4].astype(np.int32))

    def _call_prefill(self, tokens, positions, rows, last, sampling):
        self._cache, token_p, logprob_p = engine_steps.prefill(
            self._params, self._cache, tokens, positions, rows, last,
            *self._sampling_columns(sampling), config=self.model_config)
        return np.asarray(token_p), np.asarray(logprob_p)

    def _call_decode(self, feed, feed_count, position, active, remaining, stop_ids, sampling,
                     length):
        self._cache, *out = engine_steps.decode(
            self._params, self._cache, feed, feed_count, position, active, remaining, stop_ids,
            *self._sampling_columns(sampling), config=self.model_config, length=length)
        return tuple(np.asarray(x) for x in out)

    def _compile_all(self) -> None:
        """Run every compiled shape once on inert inputs (positions -1, out-of-range rows),
        which write nothing, so serving never stops to compile."""
        n = self.config.slots
        for rows in self._row_buckets:
            for bucket in self.config.prefill_buckets:
                sampling = np.zeros((rows, 5))
                self._call_prefill(np.zeros((rows, bucket), np.int32),
                                   np.full((rows, bucket), -1, np.int32),
                                   np.full((rows,), n, np.int32), np.zeros((rows,), np.int32),
                                   sampling)
        k = self.config.decode_steps_per_call
        for length in self._length_buckets:
            self._call_decode(np.zeros((n, k), np.int32), np.zeros((n,), np.int32),
                              np.zeros((n,), np.int32), np.zeros((n,), bool),
                              np.zeros((n,), np.int32),
                              np.full((n, self.config.max_stop_ids), -1, np.int32),
                              np.zeros((n, 5)), length)

    def _prefill(self) -> None:
        rows = [s for s in self._slots if s.job is not None
                and len(s.job.context) - s.kv_len > self.config.fold_prefill_tokens]
        if not rows:
            return
        buckets = self.config.prefill_buckets
        by_bucket: dict[int, list[Slot]] = collections.defaultdict(list)
        for slot in rows:
            chunk = min(len(slot.job.context) - slot.kv_len, buckets[-1])
            by_bucket[next(b for b in buckets if b >= chunk)].append(slot)
        for bucket, group in sorted(by_bucket.items()):
            for start in range(0, len(group), self.config.slots):
                self._prefill_rows(bucket, group[start:start + self.config.slots])

    def _prefill_rows(self, bucket: int, slots: list[Slot]) -> None:
        num_rows = next(b for b in self._row_buckets if b >= len(slots))
        tokens = np.zeros((num_rows, bucket), np.int32)
        positions = np.full((num_rows, bucket), -1, np.int32)
        rows = np.full((num_rows,), self.config.slots, np.int32)
        last = np.zeros((num_rows,), np.int32)
        sampling = np.zeros((num_rows, 5), np.float64)
        sampling[:, 1] = 1.0
        chunks = []
        for i, slot in enumerate(slots):
            job = slot.job
            chunk = job.context[slot.kv_len:slot.kv_len + bucket]
            tokens[i, :len(chunk)] = chunk
            positions[i, :len(chunk)] = np.arange(slot.kv_len, slot.kv_len + len(chunk))
            rows[i], last[i] = slot.index, len(chunk) - 1
            sampling[i] = self._sampling_row(job)
            chunks.append(len(chunk))
        version = self._version
        token_p, logprob_p = self._call_prefill(tokens, positions, rows, last, sampling)
        self.stats["prefill_calls"] += 1
        for i, slot in enumerate(slots):
            slot.kv_len += chunks[i]
            self.stats["prefill_tokens"] += chunks[i]
            if slot.kv_len == len(slot.job.context):  # whole context fed: the sample counts
                self._emit(slot, int(token_p[i]), float(logprob_p[i]), version)

    def _decode(self) -> None:
        n, c = self.config.slots, self.config
        k = c.decode_steps_per_call
        rows = [s for s in self._slots if s.job is not None
                and 1 <= len(s.job.context) - s.kv_len <= c.fold_prefill_tokens]
        if not rows:
            return
        feed = np.zeros((n, k), np.int32)
        feed_count = np.zeros((n,), np.int32)
        position = np.zeros((n,), np.int32)
        active = np.zeros((n,), bool)
        remaining = np.zeros((n,), np.int32)
        stop_ids = np.full((n, c.max_stop_ids), -1, np.int32)
        sampling = np.zeros((n, 5), np.float64)
        sampling[:, 1] = 1.0
        for slot in rows:
            job, i = slot.job, slot.index
            unfed = job.context[slot.kv_len:slot.kv_len + k]
            feed[i, :len(unfed)] = unfed
            feed_count[i] = len(job.context) - slot.kv_len
            position[i], active[i] = slot.kv_len, True
            remaining[i] = min(job.max_new - len(job.tokens), c.max_seq_len - len(job.context))
            ids = sorted(job.stop_ids)
            stop_ids[i, :len(ids)] = ids
            sampling[i] = self._sampling_row(job)
        version = self._version
        # Attend over the smallest length bucket holding every position this call writes.
        needed = min(int(position[active].max()) + k, c.max_seq_len)
        length = next(b for b in self._length_buckets if b >= needed)
        token_ks, logprob_ks, emitted_ks, fed_ks = self._call_decode(
            feed, feed_count, position, active, remaining, stop_ids, sampling, length)
        self.stats["decode_calls"] += 1
        self.stats["decode_row_steps"] += int(fed_ks.sum())  # / (calls * slots * k): occupancy
        for slot in rows:
            i = slot.index
            for step in range(k):
                if slot.job is None or not fed_ks[step, i]:
                    break
                slot.kv_len += 1  # the fed token's k/v is now in the row
                if emitted_ks[step, i]:
                    self._emit(slot, int(token_ks[step, i]), float(logprob_ks[step, i]),
                               version)
                else:
                    self.stats["folded_tokens"] += 1

    # ------------------------------------------------------------------ bookkeeping

    def _emit(self, slot: Slot, token: int, logprob: float, version: int) -> None:
        job = slot.job
        job.tokens.append(token)
        job.logprobs.append(logprob)
        job.versions.append(version)
        job.context.append(token)
        self.stats["generated_tokens"] += 1
        stop_strings = job.request.sampling.stop_strings
        if token in job.stop_ids:
            self._finish(slot, FinishReason.STOP)
        elif stop_strings and self._hit_stop_string(job.tokens, stop_strings):
            self._finish(slot, FinishReason.STOP)
        elif len(job.tokens) >= job.max_new or len(job.context) >= self.config.max_seq_len:
            self._finish(slot, FinishReason.LENGTH)

    def _hit_stop_string(self, tokens: list[int], stop_strings: Sequence[str]) -> bool:
        # A stop string of L characters spans at most 4L byte-level tokens; decode a window
        # that covers it (earlier occurrences would have stopped the request already).
        window = 4 * max(len(s) for s in stop_strings) + 4
        text = self._decode_text(tokens[-window:])
        return any(s in text for s in stop_strings)

    def _finish(self, slot: Slot, reason: FinishReason) -> None:
        job = self._table.finish(slot, time.monotonic(), continues=reason is not FinishReason.ABORT)
        self._resolve(job, reason)

    def _resolve(self, job: Job, reason: FinishReason) -> None:
        if job.future.done():
            return
        job.future.set_result(Generation(
            request_id=job.request.request_id, token_ids=tuple(job.tokens),
            logprobs=tuple(job.logprobs), versions=tuple(job.versions), finish_reason=reason))
