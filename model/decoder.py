"""The decoder: a Flax linen Llama / Qwen2 transformer behind pure functions.

What it is: RMSNorm, rotary position embeddings (default, linear, llama3 scaling), grouped-
query attention via `jax.nn.dot_product_attention` (optional q/k/v bias for Qwen2), a SwiGLU
MLP, tied or untied embeddings, layers stacked with `nn.scan`. The public API is pure
functions over a plain params dict (no module objects in hot paths), so the learner and the
rollout engine can `jax.jit` them with `config` static:

    init_params(config, rng) -> params
    param_logical_axes(config) -> same tree of PartitionSpec(logical names)
    forward(params, config, tokens_bt, positions_bt=None, attention_mask_bt=None) -> logits_btv
    forward_with_hidden(params, config, tokens_bt, ...) -> (logits_btv, final hidden_btd)
    init_cache(config, batch, max_len, dtype=None) -> cache
    forward_with_cache(params, config, tokens_bt, positions_bt, cache) -> (logits_btv, cache)
    token_logprobs(params, config, tokens_bt, attention_mask_bt=None, temperature=1.0)
        -> logprobs [b, t-1]; entry i scores tokens[:, i+1] under the logits at i
    logprobs_from_logits(logits_btv, targets_bt, temperature=1.0) -> [b, t]

What it is not: a sampler (the rollout engine owns sampling and slot bookkeeping), and not
sharding policy: parameters carry only logical axis names ('vocab', 'embed', 'mlp', 'heads',
'kv_heads', 'head_dim', 'layers'); activations are constrained with 'batch', 'seq', 'embed',
'heads', 'kv_heads', 'mlp', 'vocab'. Without logical axis rules in context those
constraints are no-ops; the learner maps names to its mesh (`learner/sharding.py`).

Shape letters: b batch, t query tokens, s cache slots (= positions), d hidden, h query
heads, k kv heads, e head_dim, f mlp width, v vocab, l layers.

Param layout (float32; the leading `l` axis comes from `nn.scan`):

    embed/embedding            [v, d]      ('vocab', 'embed')
    layers/input_norm/scale    [l, d]
    layers/attn/q_kernel       [l, d, h, e]   q_bias [l, h, e]   (bias only if qkv_bias)
    layers/attn/k_kernel       [l, d, k, e]   k_bias [l, k, e]
    layers/attn/v_kernel       [l, d, k, e]   v_bias [l, k, e]
    layers/attn/o_kernel       [l, h, e, d]
    layers/post_attn_norm/scale [l, d]
    layers/mlp/gate_kernel     [l, d, f]   up_kernel [l, d, f]   down_kernel [l, f, d]
    final_norm/scale           [d]
    lm_head/kernel             [d, v]      (absent when tie_embeddings)

Invariants:
- logits are float32 whatever the compute dtype;
- `forward` is causal by token index and never attends to keys where attention_mask is 0;
- `forward_with_cache` writes each token's k/v at slot `positions[b, t]` of its own row,
  then attends to slots <= its own position. The cache therefore must hold the row's
  tokens at every slot below the query's position; rows are independent (ragged lengths,
  continuous batching). A token with position < 0 writes nothing (use it for padding;
  its logits are finite but meaningless). Two tokens of one row must not share a position
  in one call. The cache-vs-forward equality (1e-5) is tested in float32 on CPU; on GPUs
  the default float32 matmul precision may be reduced (TF32), which loosens it.
- behaviour logprobs are defined once, by `logprobs_from_logits`: log softmax of
  logits / temperature, i.e. the distribution actually sampled from.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from model.config import ModelConfig

logger = logging.getLogger(__name__)

Params = dict[str, Any]
Cache = dict[str, jax.Array]

_INIT_STD = 0.02


def _dtype(name: str) -> jnp.dtype:
    return jnp.dtype(name)


# --------------------------------------------------------------------------- RoPE


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies [e/2] in float32, with HF's 'linear' / 'llama3' scaling rules."""
    dim = config.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (np.float32(1.0) / np.power(np.float32(config.rope_theta), exponents)).astype(
        np.float32)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    rope_type = scaling["rope_type"]
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return (inv_freq / np.float32(factor)).astype(np.float32)
    if rope_type == "llama3":
        # Meta's Llama 3.1 frequency smoothing (as in HF `_compute_llama3_parameters`).
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * np.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    raise AssertionError(f"unhandled rope_type {rope_type!r}")  # config validates this


def apply_rope(x_bthe: jax.Array, positions_bt: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate-half RoPE (HF convention: first half / second half of head_dim are the pair)."""
    angles = positions_bt.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [b,t,e/2]
    cos = jnp.cos(angles)[:, :, None, :].astype(x_bthe.dtype)
    sin = jnp.sin(angles)[:, :, None, :].astype(x_bthe.dtype)
    x1, x2 = jnp.split(x_bthe, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


# --------------------------------------------------------------------------- modules


def _param(module: nn.Module, name: str, shape: tuple[int, ...], names: tuple[str, ...],
           init: Any) -> jax.Array:
    return module.param(name, nn.with_logical_partitioning(init, names), shape, jnp.float32)


class RMSNorm(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = _param(self, "scale", (self.config.hidden_size,), ("embed",),
                       nn.initializers.ones)
        # Normalise in float32 and cast back before scaling, as HF does.
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True)
                                  + self.config.rms_norm_eps)
        return scale.astype(x.dtype) * x32.astype(x.dtype)


class Attention(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x_btd: jax.Array, positions_bt: jax.Array, mask_b1ts: jax.Array | None,
                 cache_kv: tuple[jax.Array, jax.Array] | None, layer: jax.Array):
        c = self.config
        dt = _dtype(c.dtype)
        d, h, k, e = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        init = nn.initializers.normal(_INIT_STD)
        projections = {}
        for name, heads, head_axis in (("q", h, "heads"), ("k", k, "kv_heads"),
                                       ("v", k, "kv_heads")):
            kernel = _param(self, f"{name}_kernel", (d, heads, e),
                            ("embed", head_axis, "head_dim"), init)
            y = jnp.einsum("btd,dhe->bthe", x_btd, kernel.astype(dt))
            if c.qkv_bias:
                y = y + _param(self, f"{name}_bias", (heads, e), (head_axis, "head_dim"),
                               nn.initializers.zeros).astype(dt)
            projections[name] = nn.with_logical_constraint(
                y, ("batch", "seq", head_axis, None))
        o_kernel = _param(self, "o_kernel", (h, e, d), ("heads", "head_dim", "embed"), init)

        inv_freq = rope_inv_freq(c)
        q = apply_rope(projections["q"], positions_bt, inv_freq)
        k_new = apply_rope(projections["k"], positions_bt, inv_freq)
        v_new = projections["v"]

        if cache_kv is None:
            keys, values, new_cache = k_new, v_new, None
        else:
            # The whole [l, b, s, k, e] cache rides in the scan carry and is updated at this
            # layer's index, so under jit (cache donated) XLA writes it in place instead of
            # copying every layer's cache once per call.
            cache_k, cache_v = cache_kv
            slots = cache_k.shape[2]
            # Positions < 0 are padding: send them out of bounds so the scatter drops them.
            write = jnp.where(positions_bt < 0, slots, positions_bt)
            rows = jnp.arange(x_btd.shape[0])[:, None]
            cache_k = cache_k.at[layer, rows, write].set(k_new.astype(cache_k.dtype), mode="drop")
            cache_v = cache_v.at[layer, rows, write].set(v_new.astype(cache_v.dtype), mode="drop")
            keys = jax.lax.dynamic_index_in_dim(cache_k, layer, keepdims=False).astype(dt)
            values = jax.lax.dynamic_index_in_dim(cache_v, layer, keepdims=False).astype(dt)
            new_cache = (cache_k, cache_v)
            # Mask by position: slot j holds position j; attend to j <= own position.
            slot_ids = jnp.arange(slots)
            mask_b1ts = (slot_ids[None, None, :] <= positions_bt[:, :, None])[:, None]

        out = jax.nn.dot_product_attention(q, keys, values, mask=mask_b1ts)  # [b,t,h,e]
        out = nn.with_logical_constraint(out, ("batch", "seq", "heads", None))
        y = jnp.einsum("bthe,hed->btd", out, o_kernel.astype(dt))
        return nn.with_logical_constraint(y, ("batch", "seq", "embed")), new_cache


class MLP(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x_btd: jax.Array) -> jax.Array:
        c = self.config
        dt = _dtype(c.dtype)
        init = nn.initializers.normal(_INIT_STD)
        gate = _param(self, "gate_kernel", (c.hidden_size, c.intermediate_size),
                      ("embed", "mlp"), init)
        up = _param(self, "up_kernel", (c.hidden_size, c.intermediate_size), ("embed", "mlp"),
                    init)
        down = _param(self, "down_kernel", (c.intermediate_size, c.hidden_size),
                      ("mlp", "embed"), init)
        g = jnp.einsum("btd,df->btf", x_btd, gate.astype(dt))
        u = jnp.einsum("btd,df->btf", x_btd, up.astype(dt))
        hidden = nn.with_logical_constraint(jax.nn.silu(g) * u, ("batch", "seq", "mlp"))
        y = jnp.einsum("btf,fd->btd", hidden, down.astype(dt))
        return nn.with_logical_constraint(y, ("batch", "seq", "embed"))


class DecoderLayer(nn.Module):
    """One pre-norm block. Signature fits `nn.scan`: (carry, *broadcast) -> (carry, None),
    carry = (x_btd, cache (k, v) or None, layer index)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, carry, positions_bt, mask_b1ts):
        x_btd, cache_kv, layer = carry
        attn_out, cache_kv = Attention(self.config, name="attn")(
            RMSNorm(self.config, name="input_norm")(x_btd), positions_bt, mask_b1ts, cache_kv,
            layer)
        x_btd = x_btd + attn_out
        x_btd = x_btd + MLP(self.config, name="mlp")(
            RMSNorm(self.config, name="post_attn_norm")(x_btd))
        return (x_btd, cache_kv, layer + 1), None


class _Weight(nn.Module):
    """Holds one named matrix (so the tree reads embed/embedding, lm_head/kernel)."""

    config: ModelConfig
    param_name: str
    shape: tuple[int, ...]
    names: tuple[str, ...]

    @nn.compact
    def __call__(self) -> jax.Array:
        return _param(self, self.param_name, self.shape, self.names,
                      nn.initializers.normal(_INIT_STD))


class Decoder(nn.Module):
    """Embeddings -> scanned DecoderLayers -> final RMSNorm -> LM head (float32 logits)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, tokens_bt, positions_bt, mask_b1ts, cache=None):
        c = self.config
        dt = _dtype(c.dtype)
        embedding = _Weight(c, "embedding", (c.vocab_size, c.hidden_size), ("vocab", "embed"),
                            name="embed")()
        x = jnp.take(embedding, tokens_bt, axis=0).astype(dt)
        x = nn.with_logical_constraint(x, ("batch", "seq", "embed"))
        layers = nn.scan(
            DecoderLayer,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=(nn.broadcast, nn.broadcast),
            length=c.num_layers,
            metadata_params={nn.PARTITION_NAME: "layers"},
        )(c, name="layers")
        cache_kv = None if cache is None else (cache["k"], cache["v"])
        (x, new_kv, _), _ = layers((x, cache_kv, jnp.zeros((), jnp.int32)), positions_bt,
                                   mask_b1ts)
        x = RMSNorm(c, name="final_norm")(x)
        self.sow("intermediates", "final_hidden", x)  # kept only when applied with it mutable
        if c.tie_embeddings:
            logits = jnp.einsum("btd,vd->btv", x, embedding.astype(dt),
                                preferred_element_type=jnp.float32)
        else:
            head = _Weight(c, "kernel", (c.hidden_size, c.vocab_size), ("embed", "vocab"),
                           name="lm_head")()
            logits = jnp.einsum("btd,dv->btv", x, head.astype(dt),
                                preferred_element_type=jnp.float32)
        logits = nn.with_logical_constraint(logits.astype(jnp.float32),
                                            ("batch", "seq", "vocab"))
        new_cache = None if cache is None else {"k": new_kv[0], "v": new_kv[1]}
        return logits, new_cache


# --------------------------------------------------------------------------- public API


def _dummy_inputs(config: ModelConfig):
    tokens = jnp.zeros((1, 1), jnp.int32)
    return tokens, jnp.zeros((1, 1), jnp.int32), None


@functools.partial(jax.jit, static_argnums=0)
def _init(config: ModelConfig, rng: jax.Array) -> Params:
    return nn.unbox(Decoder(config).init(rng, *_dummy_inputs(config))["params"])


def init_params(config: ModelConfig, rng: jax.Array) -> Params:
    """Fresh float32 parameters (plain nested dict, no partitioning boxes). Deterministic in rng.

    `jax.eval_shape(lambda: init_params(config, rng))` gives the shapes without compiling."""
    return _init(config, rng)


def param_logical_axes(config: ModelConfig) -> Any:
    """Tree shaped like `init_params` whose leaves are PartitionSpecs of logical axis names.

    Map to mesh shardings with `nn.logical_to_mesh_sharding(axes, mesh, rules)`."""
    abstract = jax.eval_shape(Decoder(config).init, jax.random.key(0), *_dummy_inputs(config))
    return nn.get_partition_spec(abstract["params"])


def default_positions(tokens_bt: jax.Array, attention_mask_bt: jax.Array | None) -> jax.Array:
    """0..T-1 per row, or, with a mask, the count of valid tokens before each one (so left
    padding also gets positions starting at 0 on the first real token)."""
    if attention_mask_bt is None:
        return jnp.broadcast_to(jnp.arange(tokens_bt.shape[1], dtype=jnp.int32), tokens_bt.shape)
    return jnp.maximum(jnp.cumsum(attention_mask_bt.astype(jnp.int32), axis=1) - 1, 0)


def forward(params: Params, config: ModelConfig, tokens_bt: jax.Array,
            positions_bt: jax.Array | None = None,
            attention_mask_bt: jax.Array | None = None) -> jax.Array:
    """Causal float32 logits [b, t, v] for a full sequence (no cache).

    attention_mask_bt (1 = real token, 0 = pad) removes pad keys from every query, so right-
    or left-padded batches give each real token the logits of its unpadded row. Logits at pad
    positions are meaningless. positions_bt defaults to `default_positions`."""
    logits, _ = Decoder(config).apply({"params": params},
                                      *_full_inputs(tokens_bt, positions_bt, attention_mask_bt))
    return logits


def forward_with_hidden(params: Params, config: ModelConfig, tokens_bt: jax.Array,
                        positions_bt: jax.Array | None = None,
                        attention_mask_bt: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """`forward` plus the final hidden state: (logits_btv, hidden_btd), hidden being the
    final RMSNorm's output (the LM head's input), in the compute dtype. For heads on top of
    the decoder: the learner's value head, the reward model's score head."""
    (logits, _), state = Decoder(config).apply(
        {"params": params}, *_full_inputs(tokens_bt, positions_bt, attention_mask_bt),
        mutable=["intermediates"])
    return logits, state["intermediates"]["final_hidden"][0]


def _full_inputs(tokens_bt, positions_bt, attention_mask_bt):
    """(tokens, positions, causal mask [b|1, 1, t, t]) of a cache-free full-sequence call."""
    tokens_bt = jnp.asarray(tokens_bt, jnp.int32)
    if positions_bt is None:
        positions_bt = default_positions(tokens_bt, attention_mask_bt)
    t = tokens_bt.shape[1]
    mask_b1ts = jnp.tril(jnp.ones((t, t), jnp.bool_))[None, None]
    if attention_mask_bt is not None:
        mask_b1ts = mask_b1ts & attention_mask_bt.astype(jnp.bool_)[:, None, None, :]
    return tokens_bt, positions_bt, mask_b1ts


def init_cache(config: ModelConfig, batch: int, max_len: int, dtype: Any = None) -> Cache:
    """Zeroed KV cache {'k', 'v'}: [l, b, max_len, k, e] each, in `dtype` (default: the
    compute dtype). Slot j of row b holds the key/value of that row's position j."""
    dtype = _dtype(config.dtype) if dtype is None else jnp.dtype(dtype)
    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def forward_with_cache(params: Params, config: ModelConfig, tokens_bt: jax.Array,
                       positions_bt: jax.Array, cache: Cache) -> tuple[jax.Array, Cache]:
    """Prefill (t > 1) or decode (t == 1) against a KV cache; returns (logits_btv, cache).

    Each token's k/v is written at slot positions_bt[b, t] of its own row, then every token
    attends to its row's slots <= its own position. Rows are independent, so a rollout
    engine can keep ragged per-slot lengths (continuous batching). Positions < 0 mark
    padding: nothing is written and their logits are meaningless. Donate `cache` under jit
    to update it in place."""
    tokens_bt = jnp.asarray(tokens_bt, jnp.int32)
    positions_bt = jnp.asarray(positions_bt, jnp.int32)
    return Decoder(config).apply({"params": params}, tokens_bt, positions_bt, None, cache)


def logprobs_from_logits(logits_btv: jax.Array, targets_bt: jax.Array,
                         temperature: float | jax.Array = 1.0) -> jax.Array:
    """THE definition of behaviour logprobs: log softmax(logits / temperature)[target].

    This is the temperature-scaled distribution the sampler actually draws from, so the
    learner's importance ratios compare like with like. Float32 in, float32 [b, t] out."""
    scaled = logits_btv.astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(scaled, axis=-1)
    return jnp.take_along_axis(logp, targets_bt[..., None].astype(jnp.int32), axis=-1)[..., 0]


def token_logprobs(params: Params, config: ModelConfig, tokens_bt: jax.Array,
                   attention_mask_bt: jax.Array | None = None,
                   temperature: float | jax.Array = 1.0) -> jax.Array:
    """Logprobs [b, t-1]: entry [:, i] is log p(tokens[:, i+1] | tokens[:, :i+1]) under
    softmax(logits / temperature) (see `logprobs_from_logits`). Entries whose target token
    is masked out (attention_mask 0) are 0.0."""
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"token_logprobs temperature must be > 0, got {temperature!r}")
    logits = forward(params, config, tokens_bt, attention_mask_bt=attention_mask_bt)
    logp = logprobs_from_logits(logits[:, :-1], jnp.asarray(tokens_bt)[:, 1:], temperature)
    if attention_mask_bt is not None:
        logp = jnp.where(jnp.asarray(attention_mask_bt)[:, 1:].astype(jnp.bool_), logp, 0.0)
    return logp
