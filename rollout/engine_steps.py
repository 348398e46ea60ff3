"""The compiled steps of the JAX engine: pure functions over (params, KV cache, row arrays).

What it is: `prefill` feeds a chunk of tokens into some cache rows and samples one token per
row from the last real position; `decode` runs k single-token steps over every row of the
cache in one `lax.scan` (first feeding each row's few unfed context tokens, then its own
samples), stopping rows in-graph at a stop token or their token budget.
Both are `jax.jit` at module level with the model config and step count static and the cache
donated, so every engine with equal shapes shares one compiled program per shape.

What it is not: a scheduler. Which rows run, their budgets and the bookkeeping of tokens live
in `rollout/engine_jax.py`; these functions never branch in Python on array values.

Shapes (letters as in `model.decoder`): s slots (cache rows), p rows being prefilled (padded to
a power of 4 or s; pad rows use the out-of-range row index s, so their writes are dropped), t the
prefill bucket, k decode steps per call, x the padded stop-id list. Positions < 0 write nothing
(`model.decoder.forward_with_cache`), which is how inactive rows and padding stay inert.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from model.config import ModelConfig
from model.decoder import Cache, Params, forward_with_cache
from rollout.sampling import sample


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def prefill(params: Params, cache: Cache, tokens_pt: jax.Array, positions_pt: jax.Array,
            rows_p: jax.Array, last_p: jax.Array, temperature_p: jax.Array,
            top_p_p: jax.Array, top_k_p: jax.Array, seed_p: jax.Array, step_p: jax.Array, *,
            config: ModelConfig) -> tuple[Cache, jax.Array, jax.Array]:
    """Write tokens_pt at positions_pt into cache rows rows_p; sample after index last_p.

    Returns (cache, token_p, logprob_p). Pad rows (rows_p == s) read a clipped row and write
    nothing; their samples are meaningless."""
    row_cache = {name: jnp.take(c, rows_p, axis=1, mode="clip") for name, c in cache.items()}
    logits_ptv, row_cache = forward_with_cache(params, config, tokens_pt, positions_pt,
                                               row_cache)
    cache = {name: cache[name].at[:, rows_p].set(row_cache[name], mode="drop")
             for name in cache}
    last_pv = jnp.take_along_axis(logits_ptv, last_p[:, None, None], axis=1)[:, 0]
    token_p, logprob_p = sample(last_pv, temperature_p, top_p_p, top_k_p, seed_p, step_p)
    return cache, token_p, logprob_p


@functools.partial(jax.jit, static_argnames=("config", "length"), donate_argnames=("cache",))
def decode(params: Params, cache: Cache, feed_sk: jax.Array, feed_count_s: jax.Array,
           position_s: jax.Array, active_s: jax.Array, remaining_s: jax.Array,
           stop_ids_sx: jax.Array, temperature_s: jax.Array, top_p_s: jax.Array,
           top_k_s: jax.Array, seed_s: jax.Array, step_s: jax.Array, *, config: ModelConfig,
           length: int) -> tuple[Cache, jax.Array, jax.Array, jax.Array, jax.Array]:
    """k = feed_sk.shape[1] one-token steps over all rows, starting at position_s[r].

    Row r first feeds its unfed context tokens feed_sk[r, :feed_count_s[r]] (teacher forcing:
    a short turn continuation rides along a step that computes every row anyway, instead of
    costing a prefill call), then feeds back what it samples. The sample after its last unfed
    token is its first emitted token; it stays active until it emits one of its stop ids or
    remaining_s[r] tokens. feed_count_s[r] > k means the whole call only feeds.

    Only the first `length` cache slots take part (the caller guarantees every position
    written in this call is < length): a step reads KV of `length` slots, not the whole row.
    Returns (cache, token_ks, logprob_ks, emitted_ks, fed_ks): fed_ks[i, r] says row r wrote
    a k/v at step i; emitted_ks[i, r] says token_ks[i, r] is an output token."""
    num_steps = feed_sk.shape[1]
    full = cache
    cache = {name: jax.lax.slice_in_dim(c, 0, length, axis=2) for name, c in full.items()}

    def step(carry, i):
        cache, token_s, position_s, active_s, remaining_s, step_s = carry
        forced_s = i < feed_count_s
        token_s = jnp.where(forced_s, feed_sk[:, i], token_s)
        feed_positions = jnp.where(active_s, position_s, -1)
        logits, cache = forward_with_cache(params, config, token_s[:, None],
                                           feed_positions[:, None], cache)
        new_s, logprob_s = sample(logits[:, 0], temperature_s, top_p_s, top_k_s, seed_s, step_s)
        emitted_s = active_s & (i >= feed_count_s - 1)
        emits = emitted_s.astype(jnp.int32)
        stopped_s = jnp.any(new_s[:, None] == stop_ids_sx, axis=-1)
        remaining_s = remaining_s - emits
        fed_s = active_s
        token_s = jnp.where(emitted_s, new_s, token_s)
        active_s = active_s & ~(emitted_s & (stopped_s | (remaining_s <= 0)))
        carry = (cache, token_s, position_s + fed_s.astype(jnp.int32), active_s, remaining_s,
                 step_s + emits)
        return carry, (new_s, logprob_s, emitted_s, fed_s)

    init = (cache, feed_sk[:, 0], position_s, active_s, remaining_s, step_s)
    carry, (token_ks, logprob_ks, emitted_ks, fed_ks) = jax.lax.scan(
        step, init, jnp.arange(num_steps))
    cache = {name: jax.lax.dynamic_update_slice_in_dim(full[name], carry[0][name], 0, axis=2)
             for name in full}
    return cache, token_ks, logprob_ks, emitted_ks, fed_ks
