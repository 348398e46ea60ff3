"""The compiled steps of the JAX engine: pure functions over (params, KV cache, row arrays).

What it is: `prefill` feeds a chunk of tokens into some cache rows and samples one token per
row from the last real position; `decode` runs `num_steps` single-token steps over every row
of the cache in one `lax.scan`, stopping rows in-graph at a stop token or their token budget.
Both are `jax.jit` at module level with the model config and step count static and the cache
donated, so every engine with equal shapes shares one compiled program per shape.

What it is not: a scheduler. Which rows run, their budgets and the bookkeeping of tokens live
in `rollout/engine_jax.py`; these functions never branch in Python on array values.

Shapes (letters as in `model.decoder`): s slots (cache rows), p rows being prefilled (padded to
a power of 4 or s; pad rows use the out-of-range row index s, so their writes are dropped), t the
prefill bucket, k decode steps, x the padded stop-id list. Positions < 0 write nothing
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


@functools.partial(jax.jit, static_argnames=("config", "num_steps", "length"),
                   donate_argnames=("cache",))
def decode(params: Params, cache: Cache, token_s: jax.Array, position_s: jax.Array,
           active_s: jax.Array, remaining_s: jax.Array, stop_ids_sx: jax.Array,
           temperature_s: jax.Array, top_p_s: jax.Array, top_k_s: jax.Array,
           seed_s: jax.Array, step_s: jax.Array, *, config: ModelConfig, num_steps: int,
           length: int) -> tuple[Cache, jax.Array, jax.Array, jax.Array]:
    """`num_steps` decode steps over all rows. Row r feeds token_s[r] at position_s[r].

    Only the first `length` cache slots take part (the caller guarantees every position
    written in this call is < length): attention reads, per step, KV of `length` slots instead
    of the whole row, so a step costs what the context needs, not what max_seq_len allows.
    A row stays active until it samples one of its stop ids or has emitted remaining_s[r]
    tokens. Returns (cache, token_ks, logprob_ks, emitted_ks): emitted_ks[i, r] says row r
    produced token_ks[i, r] at step i (inactive rows produce nothing and write nothing)."""
    full = cache
    cache = {name: jax.lax.slice_in_dim(c, 0, length, axis=2) for name, c in full.items()}

    def step(carry, _):
        cache, token_s, position_s, active_s, remaining_s, step_s = carry
        feed_positions = jnp.where(active_s, position_s, -1)
        logits, cache = forward_with_cache(params, config, token_s[:, None],
                                           feed_positions[:, None], cache)
        new_s, logprob_s = sample(logits[:, 0], temperature_s, top_p_s, top_k_s, seed_s, step_s)
        advance = active_s.astype(jnp.int32)
        emitted_s = active_s
        stopped_s = jnp.any(new_s[:, None] == stop_ids_sx, axis=-1)
        remaining_s = remaining_s - advance
        token_s = jnp.where(active_s, new_s, token_s)
        active_s = active_s & ~stopped_s & (remaining_s > 0)
        carry = (cache, token_s, position_s + advance, active_s, remaining_s, step_s + advance)
        return carry, (new_s, logprob_s, emitted_s)

    init = (cache, token_s, position_s, active_s, remaining_s, step_s)
    carry, (token_ks, logprob_ks, emitted_ks) = jax.lax.scan(step, init, None, length=num_steps)
    cache = {name: jax.lax.dynamic_update_slice_in_dim(full[name], carry[0][name], 0, axis=2)
             for name in full}
    return cache, token_ks, logprob_ks, emitted_ks
