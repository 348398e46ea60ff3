"""Checkpoints and weight publishing.

Proves: a checkpoint saved on an fsdp=8 mesh restores onto data=2,fsdp=4 with identical
values (params, optimiser moments, reference, RNG, step) laid out for the new mesh, together
with the controller's JSON `extra`; keep-last-N deletes old steps; checkpoints can be named by
the caller's step, a missing step is refused naming the ones there, newer ones can be discarded
(a resume from an earlier checkpoint); `publish` writes Orbax and HF snapshots whose
WeightVersion digest verifies on load.
Run: `.venv/bin/python -m pytest tests/learner/test_checkpoints.py -q` (8 fake CPU devices
from conftest.py; skips with fewer)
"""

import jax
import numpy as np
import pytest

from learner import sharding as sh
from learner.config import LearnerConfig
from learner.learner import Learner
from model import decoder
from model.weights import load_snapshot
from tests.learner.helpers import need_devices, tiny_model_config

MODEL = tiny_model_config()
CONFIG = LearnerConfig(kl_coef=0.05, learning_rate=1e-2, checkpoint_keep=2)


def _trained_learner(mesh_spec):
    """A Learner whose every state leaf holds distinct non-trivial values (a stand-in for
    training that needs no train-step compile): params, Adam moments, reference, RNG."""
    params = decoder.init_params(MODEL, jax.random.PRNGKey(4))
    learner = Learner(CONFIG, MODEL, params, sh.make_mesh(mesh_spec))

    rng = np.random.default_rng(0)
    host = jax.device_get(learner.state)
    host = jax.tree.map(lambda x: x + rng.integers(1, 9, x.shape).astype(x.dtype)
                        if np.issubdtype(x.dtype, np.integer)
                        else x + rng.normal(size=x.shape).astype(x.dtype), host)
    learner.state = jax.device_put(host, learner.state_shardings)
    return learner


@need_devices(8)
def test_save_on_fsdp8_restore_on_data2_fsdp4(tmp_path):
    learner = _trained_learner("fsdp=8")
    extra = {"cursor": 17, "consumed_task_ids": ["a", "b"], "weight_version": 3}
    step = learner.step
    assert learner.save(tmp_path / "ckpt", extra=extra) == step
    learner.wait()
    assert Learner.latest_step(tmp_path / "ckpt") == step

    new_mesh = sh.make_mesh("data=2,fsdp=4")
    restored, got_extra = Learner.restore(tmp_path / "ckpt", mesh=new_mesh)
    assert got_extra == extra
    assert restored.step == step and restored.config == CONFIG and restored.model_config == MODEL
    want, got = jax.device_get(learner.state), jax.device_get(restored.state)
    assert jax.tree.structure(want) == jax.tree.structure(got)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
    # Laid out for the new mesh: the embedding [v, d] is split over fsdp=4 on d.
    embedding = restored.state.params["embed"]["embedding"]
    assert embedding.sharding.mesh.shape == new_mesh.shape
    assert embedding.sharding.shard_shape(embedding.shape) == (64, 8)
    assert restored.state.ref_params is not None
    learner.close()


@need_devices(8)
def test_keep_last_n_and_publish(tmp_path):
    params = decoder.init_params(MODEL, jax.random.PRNGKey(4))
    learner = Learner(CONFIG, MODEL, params, sh.make_mesh("fsdp=8"))
    for step in (5, 6, 7):  # stand-in for training: only the step counter moves
        learner.state = learner.state.replace(step=jax.numpy.asarray(step, jax.numpy.int32))
        learner.save(tmp_path / "ckpt", extra={"step": step})
    learner.wait()
    kept = sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit())
    assert kept == [6, 7]
    _, extra = Learner.restore(tmp_path / "ckpt", mesh=learner.mesh, step=6)
    assert extra == {"step": 6}

    wv = learner.publish(tmp_path / "weights", version=1)
    assert wv.version == 1 and wv.step == 7 and wv.format == "orbax"
    loaded = load_snapshot(wv)  # checks the digest
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(learner.params)):
        np.testing.assert_array_equal(a, b)
    hf = learner.publish(tmp_path / "hf", version=1, format="hf_safetensors")
    assert hf.digest == wv.digest and (tmp_path / "hf" / "v00000001" / "config.json").exists()
    with pytest.raises(ValueError, match="must be one of"):
        learner.publish(tmp_path / "x", version=2, format="gguf")
    learner.close()


@need_devices(8)
def test_checkpoints_named_by_the_caller_a_missing_step_and_discarding_newer_ones(tmp_path):
    learner = _trained_learner("fsdp=8")
    for rl_step in (1, 2, 3):  # named by completed RL steps, whatever the optimiser step is
        assert learner.save(tmp_path / "ckpt", extra={"rl_step": rl_step}, step=rl_step) == rl_step
    learner.wait()
    assert Learner.checkpoint_steps(tmp_path / "ckpt") == [2, 3]  # keep-last-2
    with pytest.raises(FileNotFoundError, match=r"step must be one of the checkpoints in .* \[2, 3\], got 1"):
        Learner.restore(tmp_path / "ckpt", mesh=learner.mesh, step=1)
    restored, extra = Learner.restore(tmp_path / "ckpt", mesh=learner.mesh, step=2)
    assert extra == {"rl_step": 2} and restored.step == learner.step
    assert Learner.discard_after(tmp_path / "ckpt", 2) == [3]
    assert Learner.checkpoint_steps(tmp_path / "ckpt") == [2] == [Learner.latest_step(tmp_path / "ckpt")]
    assert Learner.checkpoint_steps(tmp_path / "nothing") == [] and Learner.discard_after(tmp_path / "nothing", 0) == []
    learner.close()
