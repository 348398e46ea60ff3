"""Fixtures for tests/rollout: one tiny HF model folder, sharpened params, one shared engine.

Every engine in these tests uses ENGINE_CONFIG (or differs only in fields that do not change
compiled shapes), so each compiled program is built once per test session. Compiling dominates
these tests on CPU, so JAX's persistent compilation cache is on (a per-user temp folder, also
handed to the worker subprocess of test_service.py through JAX_* environment variables): the
worker reuses the programs this process compiled, and reruns skip compiling. The cache is keyed
by the program and JAX version, so it never changes results.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile

import jax
import numpy as np
import pytest

from rollout.config import JaxEngineConfig

COMPILE_CACHE_ENV = {
    "JAX_COMPILATION_CACHE_DIR": os.environ.get(
        "JAX_COMPILATION_CACHE_DIR",
        os.path.join(tempfile.gettempdir(), f"orrery-jax-cache-{os.getuid()}")),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
jax.config.update("jax_compilation_cache_dir", COMPILE_CACHE_ENV["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

# slots=4 so six requests force slot refills; two prefill buckets so chunking is exercised.
ENGINE_CONFIG = JaxEngineConfig(slots=4, max_seq_len=256, prefill_buckets=(16, 64),
                                decode_steps_per_call=4)


def sharpen(params, seed: int = 0, scale: float = 0.2):
    """Seeded noise in every leaf (norm scales around 1): a random init's logits are nearly
    uniform, so greedy comparisons would hinge on float noise; these are peaked."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    rng = np.random.default_rng(seed)
    out = []
    for path, leaf in leaves:
        noise = rng.normal(size=np.shape(leaf)).astype(np.float32)
        is_scale = "scale" in jax.tree_util.keystr(path)
        out.append(1.0 + 0.3 * noise if is_scale else scale * noise)
    return jax.tree_util.tree_unflatten(treedef, out)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A llama-style HF folder from model.factory (tokenizer + config + safetensors)."""
    from model.factory import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("rollout-model") / "tiny", vocab_size=300,
                           hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from model.tokenizer import Tokenizer

    return Tokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="session")
def model(tiny_model_dir):
    """(config, sharpened float32 params) of the tiny model."""
    from model.hf_io import load_hf

    config, params = load_hf(tiny_model_dir)
    return config, sharpen(params)


@pytest.fixture(scope="session")
def engine(model, tokenizer):
    """A JaxEngine shared by the tests that never change its weights."""
    from rollout.engine_jax import JaxEngine

    config, params = model
    with JaxEngine(config, params, ENGINE_CONFIG, decode=tokenizer.decode) as eng:
        yield eng


@pytest.fixture
def engine_config():
    return ENGINE_CONFIG


def replace_config(**changes) -> JaxEngineConfig:
    return dataclasses.replace(ENGINE_CONFIG, **changes)


@functools.partial(jax.jit, static_argnums=1)
def _padded_logprobs(params, config, tokens_bt, mask_bt, temperature):
    from model.decoder import token_logprobs

    return token_logprobs(params, config, tokens_bt, mask_bt, temperature)


def learner_logprobs(params, config, tokens, temperature: float = 1.0) -> np.ndarray:
    """`model.decoder.token_logprobs` of one sequence (entry i: log p(tokens[i+1])), right-
    padded to max_seq_len so every length shares one compiled program."""
    length = ENGINE_CONFIG.max_seq_len
    padded = np.zeros((1, length), np.int32)
    mask = np.zeros((1, length), np.int32)
    padded[0, :len(tokens)], mask[0, :len(tokens)] = tokens, 1
    logp = _padded_logprobs(params, config, padded, mask, np.float32(temperature))
    return np.asarray(logp)[0, :len(tokens) - 1]
