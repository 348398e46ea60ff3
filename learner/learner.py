"""Learner: the stateful shell the controller drives; holds the sharded TrainState.

What it is: placement (state and batches onto the mesh), the one `jax.jit` of each pure
step with explicit in/out shardings and donation of the state, NaN/Inf stops, weight
publishing (params-only Orbax snapshot or HF export, with a `WeightVersion`), and full
checkpoints through an Orbax `CheckpointManager` (async, keep-last-N) that also carry the
controller's pipeline state as JSON, so one checkpoint is the whole pipeline (DESIGN rule 6).

What it is not: maths (learner/step.py, learner/loss.py), advantage estimation (the
controller calls learner/advantages.py on rewards before building a `Batch`), or a version
allocator (the controller hands `publish` increasing versions).

Typical use:

    mesh = make_mesh("data=2,fsdp=4")
    learner = Learner(LearnerConfig(), model_config, params, mesh)
    batch = Batch.from_sequences(..., row_multiple=learner.row_multiple)
    metrics = learner.train_step(batch)            # {'learner/loss': ..., ...}
    wv = learner.publish("/runs/x/weights", version=7)
    learner.save("/runs/x/ckpt", extra={"cursor": 123})
    learner, extra = Learner.restore("/runs/x/ckpt", mesh=other_mesh)

Checkpoint layout (one Orbax step folder per save): `state` (TrainState: params, value
head, optimiser, RNG, step, reference), `extra` (JSON from the controller), `config` (JSON:
LearnerConfig and ModelConfig, so `restore` needs only the folder and a mesh).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh

from learner import sharding as sh
from learner import step as step_lib
from learner.api import Batch
from learner.config import LearnerConfig
from learner.state import TrainState, init_train_state, make_optimizer, state_shardings
from model import decoder
from model.config import ModelConfig
from model.weights import WeightVersion, save_hf_snapshot, save_snapshot

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The loss or gradient norm was NaN/Inf; the update was not applied."""


def _model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**d)


def _model_config_to_dict(c: ModelConfig) -> dict[str, Any]:
    d = dataclasses.asdict(c)
    if d.get("rope_scaling") is not None:
        d["rope_scaling"] = dict(d["rope_scaling"])
    return d


class Learner:
    """Sharded train state plus the compiled steps. Not thread-safe; one per process."""

    def __init__(self, config: LearnerConfig, model_config: ModelConfig, params: Any,
                 mesh: Mesh, *, ref_params: Any | None = None,
                 _state: TrainState | None = None) -> None:
        self.config = config
        self.model_config = model_config
        self.mesh = mesh
        self.hparams = step_lib.StepHParams(
            model=dataclasses.replace(model_config, dtype=config.compute_dtype),
            loss=config.loss_hparams(), optimizer=config.optimizer_spec(),
            microbatches=config.microbatches, temperature=float(config.temperature),
            use_reference=config.uses_reference, use_value_head=config.uses_value_head,
            gamma=float(config.gamma), gae_lambda=float(config.gae_lambda))
        self._logical_axes = decoder.param_logical_axes(model_config)
        self._optimizer = make_optimizer(config.optimizer_spec())

        build = functools.partial(
            init_train_state, optimizer=self._optimizer, seed=config.seed,
            hidden_size=model_config.hidden_size, use_value_head=config.uses_value_head,
            use_reference=config.uses_reference)
        if _state is None:
            abstract = jax.eval_shape(lambda p, r: build(p, ref_params=r), params, ref_params)
        else:
            abstract = jax.eval_shape(lambda s: s, _state)
        self.state_shardings: TrainState = state_shardings(abstract, mesh, self._logical_axes)
        sh.log_param_shardings(abstract.params, self.state_shardings.params,
                               title=f"params[{sh.describe(mesh)}]")
        if _state is None:
            # Build directly on the mesh: each device materialises only its shards.
            self.state: TrainState = jax.jit(
                lambda p, r: build(p, ref_params=r), out_shardings=self.state_shardings)(
                    params, ref_params)
        else:
            self.state = _state

        self._batch_sharding = sh.batch_sharding(mesh)
        rep = sh.replicated(mesh)
        # Jit the module-level step functions (not per-instance partials) with the hparams
        # static, so two Learners with equal hparams and shardings (e.g. after restore) share
        # one compiled executable instead of compiling again.
        jit_step = functools.partial(
            jax.jit, static_argnums=2, donate_argnums=0,
            in_shardings=(self.state_shardings, self._batch_sharding),
            out_shardings=(self.state_shardings, rep))
        self._train = jit_step(step_lib.train_step)
        self._sft = jit_step(step_lib.sft_step)
        self._logprobs = jax.jit(
            step_lib.policy_logprobs, static_argnums=2,
            in_shardings=(self.state_shardings.params, self._batch_sharding),
            out_shardings=self._batch_sharding)
        self._manager: ocp.CheckpointManager | None = None
        self._manager_dir: Path | None = None

    # ------------------------------------------------------------------ properties

    @property
    def step(self) -> int:
        """Optimiser updates applied so far."""
        return int(jax.device_get(self.state.step))

    @property
    def params(self) -> Any:
        """Host (numpy) copy of the policy parameters."""
        return sh.to_host(self.state.params)  # a collective when the mesh spans processes

    @property
    def row_multiple(self) -> int:
        """Batch rows must divide by this (data-parallel size x microbatches)."""
        return sh.data_parallel_size(self.mesh) * self.config.microbatches

    # ------------------------------------------------------------------ steps

    def _device_batch(self, batch: Batch) -> dict[str, jax.Array]:
        if batch.num_rows % self.row_multiple:
            batch = batch.padded(self.row_multiple)
        arrays = batch.arrays()
        arrays.pop("versions_bt", None)  # metrics only, computed on the host
        if self.config.loss == "ppo" and "rewards_bt" not in arrays:
            raise ValueError("Batch.rewards_bt is required for loss 'ppo' (GAE needs rewards)")
        return jax.device_put(arrays, self._batch_sharding)

    def _run(self, fn, batch: Batch) -> dict[str, float]:
        start = time.perf_counter()
        device_batch = self._device_batch(batch)
        with sh.activation_context(self.mesh):
            self.state, metrics = fn(self.state, device_batch, self.hparams)
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        elapsed = time.perf_counter() - start
        metrics["perf/learner_step_s"] = elapsed
        metrics["perf/learner_tokens_per_s"] = batch.num_policy_tokens / max(elapsed, 1e-9)
        if batch.versions_bt is not None:
            versions = np.asarray(batch.versions_bt)[np.asarray(batch.loss_mask_bt) > 0]
            if versions.size:
                metrics["learner/version_min"] = float(versions.min())
                metrics["learner/version_max"] = float(versions.max())
        if metrics["learner/skipped"]:
            bad = {k: v for k, v in metrics.items() if not math.isfinite(v)}
            message = (f"non-finite loss or gradients at step {self.step}: {bad}; the update "
                       f"was not applied")
            if self.config.crash_on_nan:
                raise NonFiniteLossError(message)
            logger.warning("%s (crash_on_nan=False: skipping)", message)
        return metrics

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One RL update on `batch`; returns namespaced float metrics (learner/*, perf/*)."""
        return self._run(self._train, batch)

    def sft_step(self, batch: Batch) -> dict[str, float]:
        """One supervised (cross-entropy) update on `batch.loss_mask_bt` tokens."""
        return self._run(self._sft, batch)

    def compute_logprobs(self, batch: Batch, *, reference: bool = False) -> np.ndarray:
        """Token-aligned logprobs [b, t] (temperature-scaled, 0 on padding) of the batch under
        the current policy or the frozen reference, for the batch's original rows.

        Uses: `proximal_logprobs_bt` before several updates on one rollout batch, and the
        reference logprobs for `loss.kl_reward_penalty` (kl_mode='reward')."""
        if reference and self.state.ref_params is None:
            raise ValueError("compute_logprobs(reference=True) needs kl_coef > 0 "
                             "(the learner keeps no reference otherwise)")
        rows = batch.num_rows
        device_batch = self._device_batch(batch)
        device_batch = {k: device_batch[k] for k in ("tokens_bt", "attention_mask_bt")}
        params = self.state.ref_params if reference else self.state.params
        with sh.activation_context(self.mesh):
            out = self._logprobs(params, device_batch, self.hparams)
        return np.asarray(sh.to_host(out))[:rows]

    # ------------------------------------------------------------------ weights out

    def publish(self, root_dir: str | Path, version: int, *, format: str = "orbax",
                tokenizer_dir: str | Path | None = None) -> WeightVersion:
        """Write the policy params as snapshot `version` under `root_dir`; return its
        WeightVersion (digest included). format 'orbax' (rollout workers' JAX engine) or
        'hf_safetensors' (SGLang `update_weights_from_disk`; tokenizer files copied from
        `tokenizer_dir`). Blocks until written; the folder appears atomically."""
        params = self.params
        if format == "orbax":
            return save_snapshot(params, root_dir, version, self.step)
        if format == "hf_safetensors":
            return save_hf_snapshot(params, self.model_config, root_dir, version, self.step,
                                    tokenizer_dir=tokenizer_dir)
        raise ValueError(f"publish format must be one of ['orbax', 'hf_safetensors'], "
                         f"got {format!r}")

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_manager(self, ckpt_dir: str | Path) -> ocp.CheckpointManager:
        ckpt_dir = Path(ckpt_dir).absolute()
        if self._manager is None or self._manager_dir != ckpt_dir:
            if self._manager is not None:
                self._manager.close()
            self._manager = _make_manager(ckpt_dir, self.config)
            self._manager_dir = ckpt_dir
        return self._manager

    def save(self, ckpt_dir: str | Path, extra: dict[str, Any] | None = None, *,
             step: int | None = None) -> int:
        """Checkpoint the train state and the controller's `extra` (JSON-able) together as
        `step` (default: the optimiser step); returns the step. The three items land in one
        Orbax step folder that is renamed into place only when all are written, so a crash
        mid-save leaves the previous checkpoint as the latest. Asynchronous when
        config.async_checkpoint: the device-to-host copy happens now, the write in the
        background (`wait`)."""
        manager = self._checkpoint_manager(ckpt_dir)
        config_json = {"learner": dataclasses.asdict(self.config),
                       "model": _model_config_to_dict(self.model_config)}
        step = self.step if step is None else int(step)
        manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(self.state),
            extra=ocp.args.JsonSave(extra or {}),
            config=ocp.args.JsonSave(config_json)), force=True)
        logger.info("checkpoint step %d -> %s", step, manager.directory)
        return step

    def wait(self) -> None:
        """Block until pending asynchronous checkpoint writes are complete."""
        if self._manager is not None:
            self._manager.wait_until_finished()

    def close(self) -> None:
        if self._manager is not None:
            self._manager.wait_until_finished()
            self._manager.close()
            self._manager = None

    @staticmethod
    def latest_step(ckpt_dir: str | Path) -> int | None:
        """Newest complete checkpoint step in `ckpt_dir`, or None."""
        if not Path(ckpt_dir).exists():
            return None
        with _make_manager(Path(ckpt_dir).absolute(), LearnerConfig()) as manager:
            return manager.latest_step()

    @staticmethod
    def checkpoint_steps(ckpt_dir: str | Path) -> list[int]:
        """Every complete checkpoint step in `ckpt_dir`, ascending (unfinished saves are not listed)."""
        if not Path(ckpt_dir).exists():
            return []
        with _make_manager(Path(ckpt_dir).absolute(), LearnerConfig()) as manager:
            return sorted(manager.all_steps())

    @staticmethod
    def discard_after(ckpt_dir: str | Path, step: int) -> list[int]:
        """Delete the checkpoints newer than `step` (a run resumed from `step` replaces them);
        returns the deleted steps."""
        if not Path(ckpt_dir).exists():
            return []
        with _make_manager(Path(ckpt_dir).absolute(), LearnerConfig()) as manager:
            newer = sorted(s for s in manager.all_steps() if s > step)
            for s in newer:
                manager.delete(s)
        return newer

    @classmethod
    def restore(cls, ckpt_dir: str | Path, *, mesh: Mesh, step: int | None = None,
                config: LearnerConfig | None = None) -> tuple[Learner, dict[str, Any]]:
        """(Learner, extra) from a checkpoint, laid out for `mesh` (any shape: Orbax reads
        each device's shards straight into the new layout). `step` None = latest. `config`
        overrides the saved LearnerConfig (e.g. a new learning rate); the model config and
        whether a reference / value head exists must stay as saved."""
        ckpt_dir = Path(ckpt_dir).absolute()
        manager = _make_manager(ckpt_dir, config or LearnerConfig())
        if step is None:
            step = manager.latest_step()
            if step is None:
                raise FileNotFoundError(f"Learner.restore: no checkpoint in {ckpt_dir}")
        elif step not in manager.all_steps():
            steps = sorted(manager.all_steps())
            manager.close()
            raise FileNotFoundError(f"Learner.restore: step must be one of the checkpoints in {ckpt_dir} "
                                    f"{steps}, got {step}")
        meta = manager.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
        saved = meta["config"]
        model_config = _model_config_from_dict(saved["model"])
        config = config or LearnerConfig(**saved["learner"])

        # Shapes from a throwaway abstract init; shardings for the new mesh.
        optimizer = make_optimizer(config.optimizer_spec())
        abstract = jax.eval_shape(lambda: init_train_state(
            decoder.init_params(model_config, jax.random.PRNGKey(0)), optimizer,
            seed=config.seed, hidden_size=model_config.hidden_size,
            use_value_head=config.uses_value_head, use_reference=config.uses_reference))
        shardings = state_shardings(abstract, mesh, decoder.param_logical_axes(model_config))
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              abstract, shardings)
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), extra=ocp.args.JsonRestore()))
        manager.close()
        learner = cls(config, model_config, None, mesh, _state=restored["state"])
        logger.info("restored step %d from %s onto mesh %s", step, ckpt_dir, sh.describe(mesh))
        return learner, dict(restored["extra"] or {})


def _make_manager(ckpt_dir: Path, config: LearnerConfig) -> ocp.CheckpointManager:
    # Several JAX processes (learner hosts) write one checkpoint together; their background
    # writes raced the primary's directory setup (NOT_FOUND in process 1's OCDBT folder when
    # saves came one step apart), so multi-process saves are synchronous.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=config.checkpoint_keep,
        enable_async_checkpointing=config.async_checkpoint and jax.process_count() == 1,
        create=True)
    return ocp.CheckpointManager(ckpt_dir, options=options,
                                 item_names=("state", "extra", "config"))
