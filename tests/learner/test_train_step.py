"""The train step against slow references: one device, the full batch, the model's logprobs.

Proves:
- the learner's per-token logprobs equal `model.decoder.token_logprobs` at the sampling
  temperature (the importance ratios compare like with like);
- for meshes fsdp=8, fsdp=4,tensor=2 and data=2,fsdp=4, loss and gradients equal the
  single-device run within float32 tolerance, and one full update gives the same params;
- gradient accumulation over microbatches equals the full batch (loss, grads, metrics);
- a NaN stops the run with a clear error and leaves the state unapplied;
- PPO (value head + in-step GAE) and SFT steps run and SFT lowers its loss.
Run: `.venv/bin/python -m pytest tests/learner/test_train_step.py -q` (8 fake CPU devices
from conftest.py; multi-device cases skip with fewer).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.learner.helpers import need_devices, random_batch, tiny_model_config
from learner import sharding as sh
from learner import step as step_lib
from learner.config import LearnerConfig
from learner.learner import Learner, NonFiniteLossError
from model import decoder

# float32 sums in a different order (sharded reductions): errors ~1e-7 relative.
RTOL, ATOL = 2e-5, 1e-7

MODEL = tiny_model_config()


@functools.lru_cache(maxsize=None)
def _params():
    return jax.device_get(decoder.init_params(MODEL, jax.random.PRNGKey(1)))


def _learner(mesh_spec, config, devices=None):
    mesh = sh.make_mesh(mesh_spec, devices=devices)
    return Learner(config, MODEL, _params(), mesh)


def _loss_and_grads(learner, batch, hp=None):
    """Jitted loss_and_grads with the learner's shardings (no update)."""
    hp = hp or learner.hparams
    fn = jax.jit(functools.partial(step_lib.loss_and_grads, hp=hp),
                 in_shardings=(learner.state_shardings, sh.batch_sharding(learner.mesh)))
    device_batch = learner._device_batch(batch)
    with sh.activation_context(learner.mesh):
        loss, metrics, grads = fn(learner.state, device_batch)
    return jax.device_get((loss, metrics, grads))


def _assert_trees_close(got, want):
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=jax.tree_util.keystr(path))


# seq_mean is the demanding aggregation for microbatching (per-row means, whole-batch count);
# adam_eps is explained in test_sharded_update_equals_single_device.
CONFIG = LearnerConfig(kl_coef=0.05, entropy_coef=0.01, importance="tis", aggregation="seq_mean",
                       clip_eps_high=0.28, learning_rate=1e-2, adam_eps=1e-3)


def test_logprobs_equal_model_token_logprobs_at_temperature():
    config = dataclasses.replace(CONFIG, temperature=0.7)
    learner = _learner("fsdp=1", config, devices=jax.devices()[:1])
    batch = random_batch(rows=4, seed=3)
    got = learner.compute_logprobs(batch)
    want = np.asarray(decoder.token_logprobs(
        _params(), MODEL, batch.tokens_bt, batch.attention_mask_bt, temperature=0.7))
    # token_logprobs[:, i] is token i+1; ours is token-aligned with column 0 = 0.
    np.testing.assert_allclose(got[:, 1:], want, rtol=1e-6, atol=1e-6)
    assert np.all(got[:, 0] == 0)
    assert np.all(got[batch.attention_mask_bt == 0] == 0)


@functools.lru_cache(maxsize=None)
def _single_device_reference():
    learner = _learner("fsdp=1", CONFIG, devices=jax.devices()[:1])
    batch = random_batch(rows=16, seed=0)
    return batch, _loss_and_grads(learner, batch)


@need_devices(8)
@pytest.mark.parametrize("mesh_spec", ["fsdp=8", "fsdp=4,tensor=2", "data=2,fsdp=4"])
def test_sharded_loss_and_grads_equal_single_device(mesh_spec):
    batch, (want_loss, want_metrics, want_grads) = _single_device_reference()
    learner = _learner(mesh_spec, CONFIG)
    loss, metrics, grads = _loss_and_grads(learner, batch)
    np.testing.assert_allclose(loss, want_loss, rtol=RTOL)
    _assert_trees_close(grads, want_grads)
    _assert_trees_close(metrics, want_metrics)
    assert float(want_metrics["learner/kl"]) == 0.0  # reference == policy at step 0


@need_devices(8)
def test_sharded_update_equals_single_device():
    # Adam's update g / (sqrt(v) + eps) has slope up to 1/eps in g: with the default eps 1e-8
    # a gradient entry near zero turns float32 noise (~1e-9) into an O(lr) difference, which
    # would test conditioning, not sharding. With eps 1e-3 the update differs by at most
    # lr * |dg| / eps ~ lr * 1e-5, so two updates must agree to 1e-4 * lr. (The gradients
    # themselves are compared at float32 tolerance above.)
    config = CONFIG
    batch = random_batch(rows=8, seed=5)
    single = _learner("fsdp=1", config, devices=jax.devices()[:1])
    sharded = _learner("fsdp=4,tensor=2", config)
    for _ in range(2):
        want = single.train_step(batch)
        got = sharded.train_step(batch)
    np.testing.assert_allclose(got["learner/loss"], want["learner/loss"], rtol=RTOL)
    assert got["learner/kl"] > 0  # the policy moved away from the reference
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(sharded.params),
                            jax.tree.leaves(single.params)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * config.learning_rate,
                                   err_msg=jax.tree_util.keystr(path))
    assert sharded.step == single.step == 2


@need_devices(8)
def test_microbatches_equal_full_batch():
    # Two microbatches of 8 rows on data=2,fsdp=4 against the full 16 rows on one device.
    batch, (want_loss, want_metrics, want_grads) = _single_device_reference()
    micro = _learner("data=2,fsdp=4", dataclasses.replace(CONFIG, microbatches=2))
    loss, metrics, grads = _loss_and_grads(micro, batch)
    np.testing.assert_allclose(loss, want_loss, rtol=RTOL)
    _assert_trees_close(grads, want_grads)
    _assert_trees_close(metrics, want_metrics)


def test_nan_stops_with_clear_error_and_keeps_state():
    learner = _learner("fsdp=1", CONFIG, devices=jax.devices()[:1])
    batch = random_batch(rows=8, seed=1)  # the update test's shape: its compile is reused
    bad = dataclasses.replace(batch, advantages_bt=np.where(batch.loss_mask_bt > 0, np.nan, 0.0)
                              .astype(np.float32))
    before = learner.params
    with pytest.raises(NonFiniteLossError, match="non-finite loss or gradients at step 0"):
        learner.train_step(bad)
    assert learner.step == 0
    _assert_trees_close(learner.params, before)
    # Same hparams: reuses the compiled step; only the shell's reaction differs.
    tolerant = _learner("fsdp=1", dataclasses.replace(CONFIG, crash_on_nan=False),
                        devices=jax.devices()[:1])
    assert tolerant.train_step(bad)["learner/skipped"] == 1.0 and tolerant.step == 0


def test_ppo_and_sft_steps():
    ppo = _learner("fsdp=1", LearnerConfig(loss="ppo", advantage="gae", learning_rate=1e-2),
                   devices=jax.devices()[:1])
    batch = random_batch(rows=4, seed=2, rewards=True)
    first = ppo.train_step(batch)
    second = ppo.train_step(batch)
    # Zero-initialised value head: V = 0 at first, then it learns toward the returns.
    assert first["learner/value_mean"] == 0.0 and second["learner/value_mean"] != 0.0
    assert second["learner/value_loss"] < first["learner/value_loss"]

    sft = _learner("fsdp=1", LearnerConfig(learning_rate=3e-2), devices=jax.devices()[:1])
    losses = [sft.sft_step(batch)["learner/sft_loss"] for _ in range(4)]
    assert losses[-1] < losses[0]
    assert losses[0] == pytest.approx(np.log(MODEL.vocab_size), rel=0.05)  # untrained: ~uniform


def test_bfloat16_compute_keeps_float32_master_weights():
    # Same batch, same init: bf16 activations change the loss only at bf16 precision
    # (8 bits of mantissa: relative error ~1e-2), and the state stays float32.
    batch = random_batch(rows=8, seed=5)  # CONFIG and this shape: the f32 step is compiled
    f32 = _learner("fsdp=1", CONFIG, devices=jax.devices()[:1])
    bf16 = _learner("fsdp=1", dataclasses.replace(CONFIG, compute_dtype="bfloat16"),
                    devices=jax.devices()[:1])
    want, got = f32.train_step(batch), bf16.train_step(batch)
    assert got["learner/entropy"] == pytest.approx(want["learner/entropy"], rel=2e-2)
    assert got["learner/logprob_gap"] == pytest.approx(want["learner/logprob_gap"], rel=2e-2)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(bf16.state.params))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(bf16.state.opt_state)
               if jnp.issubdtype(x.dtype, jnp.floating))
