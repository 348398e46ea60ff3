"""Pure, jit-friendly token sampling for a batch of rows with per-row settings.

What it is: `sample(logits_sv, temperature_s, top_p_s, top_k_s, seed_s, step_s)` draws one
token per row and returns the behaviour logprob of the token drawn. Everything is traced
arrays, so changing a row's settings never recompiles.

Behaviour logprobs (the learner's importance ratios depend on this exact definition):
- temperature > 0: log softmax(logits / temperature)[token], the temperature-scaled
  distribution BEFORE top-k / top-p truncation. This is `model.decoder.logprobs_from_logits`
  with the same temperature, so the learner can recompute it from the full sequence.
- temperature == 0 (greedy): the token is argmax(logits) and its logprob is
  log softmax(logits)[token], i.e. the temperature-1 distribution.

Truncation: top-k keeps the k largest scaled logits; top-p then keeps the smallest prefix of
the remaining tokens (sorted by probability, renormalised after top-k) whose mass reaches
top_p; ties at a threshold are all kept. Rows with top_k == 0 and top_p >= 1 sample from the
full distribution; when no row truncates, the sort is skipped at run time.

Randomness: row r draws with `fold_in(key(seed[r]), step[r])`, where step is the index of
the token within its request. A request's samples therefore depend only on its own seed,
prompt and weights, not on which slot or batch it ran in.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def row_keys(seed_s: jax.Array, step_s: jax.Array) -> jax.Array:
    """One PRNG key per row: fold the token index into the request's seed."""
    return jax.vmap(lambda s, t: jax.random.fold_in(jax.random.key(s), t))(
        seed_s.astype(jnp.uint32), step_s.astype(jnp.uint32))


def _truncate(scaled_sv: jax.Array, top_p_s: jax.Array, top_k_s: jax.Array) -> jax.Array:
    """Set logits outside each row's top-k, then outside its top-p nucleus, to -inf."""
    vocab = scaled_sv.shape[-1]
    sorted_sv = -jnp.sort(-scaled_sv, axis=-1)  # descending
    k_s = jnp.where(top_k_s > 0, jnp.minimum(top_k_s, vocab), vocab)
    ranks = jnp.arange(vocab)[None, :]
    sorted_sv = jnp.where(ranks < k_s[:, None], sorted_sv, -jnp.inf)
    probs_sv = jax.nn.softmax(sorted_sv, axis=-1)
    mass_before = jnp.cumsum(probs_sv, axis=-1) - probs_sv
    keep_count = jnp.sum((mass_before < top_p_s[:, None]) & (ranks < k_s[:, None]), axis=-1)
    keep_count = jnp.maximum(keep_count, 1)
    threshold = jnp.take_along_axis(sorted_sv, (keep_count - 1)[:, None], axis=-1)
    return jnp.where(scaled_sv >= threshold, scaled_sv, -jnp.inf)


def sample(logits_sv: jax.Array, temperature_s: jax.Array, top_p_s: jax.Array,
           top_k_s: jax.Array, seed_s: jax.Array, step_s: jax.Array
           ) -> tuple[jax.Array, jax.Array]:
    """(token_s int32, behaviour logprob_s float32); see the module docstring."""
    logits_sv = logits_sv.astype(jnp.float32)
    greedy_s = temperature_s <= 0
    safe_t = jnp.where(greedy_s, 1.0, temperature_s).astype(jnp.float32)
    scaled_sv = logits_sv / safe_t[:, None]
    logp_sv = jax.nn.log_softmax(scaled_sv, axis=-1)
    truncating = (top_k_s > 0) | (top_p_s < 1.0)
    masked_sv = jax.lax.cond(jnp.any(truncating & ~greedy_s),
                             lambda x: _truncate(x, top_p_s, top_k_s), lambda x: x, scaled_sv)
    drawn_s = jax.vmap(jax.random.categorical)(row_keys(seed_s, step_s), masked_sv)
    token_s = jnp.where(greedy_s, jnp.argmax(logits_sv, axis=-1), drawn_s).astype(jnp.int32)
    logprob_s = jnp.take_along_axis(logp_sv, token_s[:, None], axis=-1)[:, 0]
    return token_s, logprob_s
