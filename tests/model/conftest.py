"""Fixtures for tests/model: tiny configs, randomised params and one tiny HF model folder."""

import jax
import numpy as np
import pytest

from model.config import ModelConfig


def tiny_config(**overrides) -> ModelConfig:
    fields = dict(vocab_size=101, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2)
    fields.update(overrides)
    return ModelConfig(**fields)


def randomize(params, seed: int = 0, scale: float = 0.2):
    """Every leaf replaced by seeded noise (norm scales around 1, biases and kernels around 0),
    so layout mistakes (a wrong transpose, a swapped norm) change the logits."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    rng = np.random.default_rng(seed)
    out = []
    for path, leaf in leaves:
        noise = rng.normal(size=np.shape(leaf)).astype(np.float32)
        if "scale" in jax.tree_util.keystr(path):
            out.append(1.0 + 0.3 * noise)
        else:
            out.append(scale * noise)
    return jax.tree_util.tree_unflatten(treedef, out)


@pytest.fixture
def make_config():
    return tiny_config


@pytest.fixture
def random_params():
    return randomize


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A llama-style HF folder from model.factory (tokenizer + config + safetensors)."""
    from model.factory import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", vocab_size=300,
                           hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
