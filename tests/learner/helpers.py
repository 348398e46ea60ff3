"""Shared helpers for tests/learner: device-count skips, a tiny model, random batches."""

import jax
import numpy as np
import pytest

from learner.api import Batch
from model.config import ModelConfig


def need_devices(n: int):
    return pytest.mark.skipif(jax.device_count() < n,
                              reason=f"needs {n} devices, have {jax.device_count()}")


def tiny_model_config(**overrides) -> ModelConfig:
    """2 layers, hidden 32, 4 heads / 2 kv heads, vocab 64: divides by every test mesh."""
    fields = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2)
    fields.update(overrides)
    return ModelConfig(**fields)


def random_batch(rows: int = 8, length: int = 16, vocab: int = 64, seed: int = 0,
                 prompt: int = 4, rewards: bool = False, behaviour_noise: float = 0.3,
                 **kwargs) -> Batch:
    """Ragged sequences: a prompt (no loss), then policy tokens with a tool-output gap."""
    rng = np.random.default_rng(seed)
    tokens, masks, behaviour, advantages, token_rewards = [], [], [], [], []
    for i in range(rows):
        n = int(rng.integers(prompt + 3, length + 1))
        tokens.append(rng.integers(0, vocab, n))
        mask = np.zeros(n, np.float32)
        mask[prompt:] = 1.0
        if n > prompt + 4:
            mask[prompt + 2:prompt + 4] = 0.0  # tool output inside the trajectory
        masks.append(mask)
        behaviour.append(-np.abs(rng.normal(2.0, behaviour_noise, n)).astype(np.float32))
        advantages.append(float(rng.normal()))
        r = np.zeros(n, np.float32)
        r[np.nonzero(mask)[0][-1]] = float(rng.normal())
        token_rewards.append(r)
    return Batch.from_sequences(tokens, masks, behaviour, advantages,
                                rewards=token_rewards if rewards else None, **kwargs)
