"""model.decoder: the KV-cache path, padding and logprobs agree with the plain forward.

Proves: (1) token-by-token decoding with the cache, ragged rows and a mixed prefill/decode
call give the full forward's logits (float32, 1e-5); (2) right and left padding with an
attention mask leave each real token's logits unchanged; (3) token_logprobs is
log_softmax(logits / T) of the next token, hand-checked; (4) params carry only the agreed
logical axis names, and forward runs under logical-axis rules on a mesh; (5) bfloat16
compute still returns float32 logits close to float32.

Run: .venv/bin/python -m pytest tests/model/test_decoder.py -q
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from model import decoder

forward = jax.jit(decoder.forward, static_argnums=1)
forward_with_cache = jax.jit(decoder.forward_with_cache, static_argnums=1, donate_argnums=4)

PARAM_AXES = {"vocab", "embed", "mlp", "heads", "kv_heads", "head_dim", "layers"}


def _setup(make_config, random_params, **overrides):
    config = make_config(**overrides)
    # Shapes only (no init compile): random_params overwrites every leaf anyway.
    params = random_params(jax.eval_shape(lambda: decoder.init_params(config, jax.random.key(0))))
    return config, params


def test_cache_decode_matches_full_forward_with_ragged_rows(make_config, random_params):
    config, params = _setup(make_config, random_params, arch="qwen2", rope_scaling={
        "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
    b, t, max_len = 3, 10, 16
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (b, t), 0, config.vocab_size))
    full = np.asarray(forward(params, config, tokens))  # each row unpadded, length t

    # Ragged prefill: row lengths 4, 7, 1; padding gets position -1 (writes nothing).
    lengths = np.array([4, 7, 1])
    cols = np.arange(7)[None]
    positions = np.where(cols < lengths[:, None], cols, -1)
    cache = decoder.init_cache(config, b, max_len)
    logits, cache = forward_with_cache(params, config, tokens[:, :7], positions, cache)
    for row in range(b):
        np.testing.assert_allclose(logits[row, :lengths[row]], full[row, :lengths[row]],
                                   rtol=1e-5, atol=1e-5)

    # Mixed call (continuous batching): row 2 prefills 3 tokens while rows 0, 1 decode one.
    chunk = np.zeros((b, 3), np.int64)
    chunk_pos = np.full((b, 3), -1)
    for row in range(b):
        n = 3 if row == 2 else 1
        chunk[row, :n] = tokens[row, lengths[row]:lengths[row] + n]
        chunk_pos[row, :n] = np.arange(lengths[row], lengths[row] + n)
    logits, cache = forward_with_cache(params, config, chunk, chunk_pos, cache)
    for row in range(b):
        n = 3 if row == 2 else 1
        np.testing.assert_allclose(logits[row, :n], full[row, lengths[row]:lengths[row] + n],
                                   rtol=1e-5, atol=1e-5)
    lengths = lengths + np.array([1, 1, 3])

    # Decode one token per row per call until row 1 reaches t.
    while lengths.max() < t:
        step_tokens = tokens[np.arange(b), lengths][:, None]
        logits, cache = forward_with_cache(params, config, step_tokens, lengths[:, None], cache)
        np.testing.assert_allclose(logits[:, 0], full[np.arange(b), lengths],
                                   rtol=1e-5, atol=1e-5)
        lengths = lengths + 1


def test_padding_with_mask_leaves_real_tokens_unchanged(make_config, random_params):
    config, params = _setup(make_config, random_params)
    tokens = np.asarray(jax.random.randint(jax.random.key(2), (2, 6), 0, config.vocab_size))
    # Causal attention: the first 4 logits of an unpadded row are those of its 4-token prefix.
    unpadded = np.asarray(forward(params, config, tokens))
    mask = np.array([[1] * 6, [1] * 4 + [0] * 2])
    right = tokens.copy()
    right[1, 4:] = 0
    logits = np.asarray(forward(params, config, right, attention_mask_bt=mask))
    np.testing.assert_allclose(logits[0], unpadded[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits[1, :4], unpadded[1, :4], rtol=1e-5, atol=1e-5)
    # Left padding: default positions count only real tokens, so row 1 starts at 0 again.
    left = np.stack([tokens[0], np.concatenate([[0, 0], tokens[1, :4]])])
    logits = np.asarray(forward(params, config, left, attention_mask_bt=mask[:, ::-1]))
    np.testing.assert_allclose(logits[1, 2:], unpadded[1, :4], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_forward_with_hidden_returns_the_lm_heads_input(make_config, random_params, tied):
    config, params = _setup(make_config, random_params, tie_embeddings=tied)
    tokens = np.asarray(jax.random.randint(jax.random.key(3), (2, 5), 0, config.vocab_size))
    mask = np.array([[1] * 5, [1] * 3 + [0] * 2])
    logits, hidden = jax.jit(decoder.forward_with_hidden, static_argnums=1)(
        params, config, tokens, attention_mask_bt=mask)
    assert hidden.shape == (2, 5, config.hidden_size)
    np.testing.assert_array_equal(logits, forward(params, config, tokens, attention_mask_bt=mask))
    head = params["embed"]["embedding"].T if tied else params["lm_head"]["kernel"]
    np.testing.assert_allclose(np.asarray(hidden) @ np.asarray(head), logits, rtol=1e-4, atol=1e-4)


def test_token_logprobs_is_shifted_temperature_log_softmax(make_config, random_params):
    config, params = _setup(make_config, random_params)
    tokens = np.array([[5, 17, 3, 99, 42, 1], [7, 7, 7, 0, 0, 0]])
    mask = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    logits = np.asarray(forward(params, config, tokens, attention_mask_bt=mask), np.float64)
    temperature = 0.7
    logp = np.asarray(jax.jit(decoder.token_logprobs, static_argnums=1)(
        params, config, tokens, mask, temperature))
    assert logp.shape == (2, 5)
    # Entry [0, 2] is log p(tokens[0, 3] = 99 | tokens[0, :3]) under logits[0, 2] / T.
    z = logits[0, 2] / temperature
    expected = z[99] - (z.max() + np.log(np.exp(z - z.max()).sum()))
    np.testing.assert_allclose(logp[0, 2], expected, rtol=1e-5)
    assert np.all(logp[1, 2:] == 0.0)  # targets are padding
    assert np.all(logp[:, :2] < 0)
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        decoder.token_logprobs(params, config, tokens, mask, 0.0)


def test_param_logical_axes_match_params_and_use_agreed_names(make_config):
    for tie in (True, False):
        config = make_config(tie_embeddings=tie, arch="llama" if tie else "qwen2")
        params = jax.eval_shape(lambda: decoder.init_params(config, jax.random.key(0)))
        axes = decoder.param_logical_axes(config)
        is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
        assert jax.tree.structure(params) == jax.tree.structure(axes, is_leaf=is_spec)
        for leaf, spec in zip(jax.tree.leaves(params), jax.tree.leaves(axes, is_leaf=is_spec)):
            assert len(spec) == leaf.ndim and set(spec) <= PARAM_AXES
            assert leaf.dtype == jnp.float32
        assert ("lm_head" in params) == (not tie)
        assert set(params) >= {"embed", "layers", "final_norm"}


def test_forward_under_logical_rules_on_a_mesh(make_config, random_params):
    config, params = _setup(make_config, random_params)
    tokens = np.arange(12).reshape(2, 6)
    expected = np.asarray(forward(params, config, tokens))
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "tensor"))
    rules = (("batch", "data"), ("heads", "tensor"), ("kv_heads", "tensor"),
             ("mlp", "tensor"), ("vocab", "tensor"), ("embed", None), ("seq", None))
    shardings = nn.logical_to_mesh_sharding(decoder.param_logical_axes(config), mesh, rules)
    sharded = jax.device_put(params, shardings)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        logits = jax.jit(decoder.forward, static_argnums=1)(sharded, config, tokens)
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_compute_returns_float32_logits(make_config, random_params):
    config, params = _setup(make_config, random_params)
    bf16 = make_config(dtype="bfloat16")
    tokens = np.arange(12).reshape(2, 6)
    ref = np.asarray(forward(params, config, tokens))
    got = forward(params, bf16, tokens)
    assert got.dtype == jnp.float32
    assert np.abs(np.asarray(got) - ref).max() < 0.05 * np.abs(ref).max()
    cache = decoder.init_cache(bf16, 2, 8)
    assert cache["k"].dtype == jnp.bfloat16 and cache["k"].shape == (2, 2, 8, 2, 8)
