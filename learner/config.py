"""LearnerConfig: every dial of the learner, frozen, validated once.

What it is: optimiser, objective, off-policy correction, numerics and checkpoint settings,
with defaults that train a small model sensibly (GRPO, token-mean, no KL). Fields marked
[recompiles] are baked into the compiled train step: changing one recompiles it. Batch
shapes recompile too, once per (rows, tokens) bucket (see learner/api.py).

What it is not: the model's shape (model.config.ModelConfig), the mesh (a spec string the
controller passes to `learner.sharding.make_mesh`), or rollout sampling settings — except
`temperature`, which must equal the sampler's because importance ratios depend on it.

Recipes (each a one-line difference from the defaults):
    GRPO       loss='grpo', advantage='grpo', aggregation='seq_mean', kl_coef=0.04
    DAPO       loss='grpo', advantage='grpo', clip_eps_high=0.28, aggregation='token_mean'
    Dr. GRPO   loss='grpo', advantage='dr_grpo', aggregation='seq_mean_token_sum'
    RLOO       loss='reinforce', advantage='rloo'
    PPO        loss='ppo', advantage='gae' (adds a value head)
    async      importance='tis' or 'decoupled' (rollouts a few versions stale)
"""

from __future__ import annotations

import dataclasses
import math

from learner.advantages import ADVANTAGE_NAMES
from learner.loss import AGGREGATIONS, IMPORTANCE, KL_ESTIMATORS, KL_MODES, LOSS_NAMES, \
    LossHParams
from learner.state import OptimizerSpec

SCHEDULES: tuple[str, ...] = ("constant", "cosine")
COMPUTE_DTYPES: tuple[str, ...] = ("float32", "bfloat16")


def _choice(name: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"LearnerConfig.{name} must be one of {list(options)}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
    """Learner settings. Units in each docstring; [recompiles] marks jit-static fields."""

    # --- optimiser (AdamW, warm-up then constant or cosine, global-norm clipping)
    learning_rate: float = 5e-5
    """Peak learning rate after warm-up."""
    warmup_steps: int = 0
    """Optimiser steps of linear warm-up from 0 to learning_rate."""
    schedule: str = "constant"
    """After warm-up: 'constant', or 'cosine' decay to min_lr_ratio * lr at total_steps."""
    total_steps: int = 1000
    """Length of the cosine schedule in optimiser steps (unused by 'constant')."""
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of learning_rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay, applied to matrices only (not norms or biases)."""
    adam_b1: float = 0.9
    """Adam first-moment decay."""
    adam_b2: float = 0.999
    """Adam second-moment decay."""
    adam_eps: float = 1e-8
    """Adam denominator epsilon."""
    max_grad_norm: float = 1.0
    """Clip gradients to this global L2 norm before Adam; 0 disables clipping."""

    # --- objective (learner/loss.py, learner/advantages.py)
    loss: str = "grpo"
    """[recompiles] Objective name: 'grpo' (clipped surrogate), 'ppo' (+ value head),
    'reinforce' (no clipping), 'sft'."""
    advantage: str = "grpo"
    """Advantage estimator: 'grpo', 'dr_grpo', 'rloo' (controller-side, on rewards) or
    'gae' (in the step, from the value head; only with loss='ppo')."""
    aggregation: str = "token_mean"
    """[recompiles] 'token_mean' (DAPO), 'seq_mean' (GRPO paper), 'seq_mean_token_sum'."""
    clip_eps_low: float = 0.2
    """[recompiles] Ratio clip below: 1 - clip_eps_low."""
    clip_eps_high: float = 0.2
    """[recompiles] Ratio clip above: 1 + clip_eps_high (DAPO uses 0.28)."""
    kl_coef: float = 0.0
    """[recompiles] Weight of KL(policy || reference); 0 skips the reference forward pass."""
    kl_estimator: str = "k3"
    """[recompiles] 'k1', 'k2' or 'k3' (Schulman's estimators)."""
    kl_mode: str = "loss"
    """'loss': KL is a loss term; 'reward': the controller subtracts
    `loss.kl_reward_penalty` from rewards (the step then only reports KL)."""
    entropy_coef: float = 0.0
    """[recompiles] Weight of the entropy bonus (subtracted from the loss)."""
    value_coef: float = 0.5
    """[recompiles] Weight of the PPO value loss."""
    gamma: float = 1.0
    """[recompiles] Discount: per token in GAE; per turn in `advantages.turn_advantages`."""
    gae_lambda: float = 0.95
    """[recompiles] GAE lambda (PPO only)."""
    importance: str = "none"
    """[recompiles] Off-policy correction: 'none', 'tis' (truncated importance weights),
    'decoupled' (AReaL's behaviour/proximal decoupled PPO)."""
    tis_cap: float = 2.0
    """[recompiles] Cap on pi_proximal / pi_behaviour (tis truncates, decoupled drops)."""
    temperature: float = 1.0
    """[recompiles] Sampling temperature that produced the behaviour logprobs; the learner
    scales its logits by 1/temperature so its logprobs mean the same thing."""

    # --- execution
    microbatches: int = 1
    """[recompiles] Gradient-accumulation steps per train step (rows must divide by
    microbatches * data-parallel size; `Batch` pads them)."""
    compute_dtype: str = "float32"
    """[recompiles] Activation dtype: 'float32' or 'bfloat16'. Master weights, optimiser
    state, logits and the loss stay float32."""
    seed: int = 0
    """Seeds the train state's RNG."""
    crash_on_nan: bool = True
    """Raise (and stop the run) when the loss or gradient norm is NaN/Inf."""
    checkpoint_keep: int = 3
    """Checkpoints kept by `Learner.save` (older ones are deleted)."""
    async_checkpoint: bool = True
    """Write checkpoints in a background thread (training continues meanwhile)."""

    def __post_init__(self) -> None:
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("loss", self.loss, LOSS_NAMES)
        _choice("advantage", self.advantage, ADVANTAGE_NAMES)
        _choice("aggregation", self.aggregation, AGGREGATIONS)
        _choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _choice("kl_mode", self.kl_mode, KL_MODES)
        _choice("importance", self.importance, IMPORTANCE)
        _choice("compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        for name in ("learning_rate", "temperature", "tis_cap"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"LearnerConfig.{name} must be a positive number, "
                                 f"got {value!r}")
        for name in ("weight_decay", "max_grad_norm", "clip_eps_low", "clip_eps_high",
                     "kl_coef", "entropy_coef", "value_coef", "adam_eps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"LearnerConfig.{name} must be a finite number >= 0, "
                                 f"got {value!r}")
        for name in ("gamma", "gae_lambda", "min_lr_ratio", "adam_b1", "adam_b2"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value <= 1):
                raise ValueError(f"LearnerConfig.{name} must be in [0, 1], got {value!r}")
        if self.clip_eps_low >= 1:
            raise ValueError(f"LearnerConfig.clip_eps_low must be < 1, "
                             f"got {self.clip_eps_low!r}")
        for name, low in (("warmup_steps", 0), ("total_steps", 1), ("microbatches", 1),
                          ("checkpoint_keep", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"LearnerConfig.{name} must be an int >= {low}, got {value!r}")
        if self.schedule == "cosine" and self.total_steps <= self.warmup_steps:
            raise ValueError(f"LearnerConfig.total_steps must exceed warmup_steps for the "
                             f"cosine schedule, got total_steps={self.total_steps}, "
                             f"warmup_steps={self.warmup_steps}")
        if (self.loss == "ppo") != (self.advantage == "gae"):
            raise ValueError(f"LearnerConfig.loss 'ppo' and advantage 'gae' go together "
                             f"(GAE needs the PPO value head), got loss={self.loss!r}, "
                             f"advantage={self.advantage!r}")

    @property
    def uses_reference(self) -> bool:
        """Whether the frozen reference parameters are kept (any KL, in loss or reward)."""
        return self.kl_coef > 0

    @property
    def uses_value_head(self) -> bool:
        return self.loss == "ppo"

    def optimizer_spec(self) -> OptimizerSpec:
        """The optimiser scalars `learner.state.make_optimizer` reads."""
        return OptimizerSpec(
            learning_rate=float(self.learning_rate), warmup_steps=self.warmup_steps,
            schedule=self.schedule, total_steps=self.total_steps,
            min_lr_ratio=float(self.min_lr_ratio), weight_decay=float(self.weight_decay),
            b1=float(self.adam_b1), b2=float(self.adam_b2), eps=float(self.adam_eps),
            max_grad_norm=float(self.max_grad_norm))

    def loss_hparams(self, loss: str | None = None) -> LossHParams:
        """The static scalars `learner.loss` reads (loss overridable, e.g. 'sft')."""
        return LossHParams(
            loss=loss or self.loss, aggregation=self.aggregation,
            clip_eps_low=float(self.clip_eps_low), clip_eps_high=float(self.clip_eps_high),
            importance=self.importance, tis_cap=float(self.tis_cap),
            kl_coef=float(self.kl_coef), kl_estimator=self.kl_estimator,
            kl_mode=self.kl_mode, entropy_coef=float(self.entropy_coef),
            value_coef=float(self.value_coef))


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """The learner's processes under `jax.distributed` (one process = one host's devices).

    Process 0 is the controller; processes 1..n-1 are learner hosts
    (`python -m learner.host`) that follow its steps (learner/multihost.py). The learner mesh
    then spans every process's devices. One process (the default) needs none of this."""

    coordinator: str = ""
    """host:port where process 0 serves JAX's coordination service; empty = one process."""
    num_processes: int = 1
    """JAX processes in the learner, the controller included."""
    process_id: int = 0
    """This process's index (the controller is 0)."""
    local_cpu_devices: int = 0
    """CPU backend only (tests, simulation): devices this process exposes; 0 = the platform's
    default. On GPUs the local devices are the visible GPUs (CUDA_VISIBLE_DEVICES)."""
    timeout_s: int = 300
    """Longest the processes wait for each other at start (seconds)."""

    def __post_init__(self) -> None:
        if isinstance(self.num_processes, bool) or not isinstance(self.num_processes, int) \
                or self.num_processes < 1:
            raise ValueError(f"DistributedConfig.num_processes must be an int >= 1, "
                             f"got {self.num_processes!r}")
        if not (isinstance(self.process_id, int) and 0 <= self.process_id < self.num_processes):
            raise ValueError(f"DistributedConfig.process_id must be in [0, {self.num_processes}), "
                             f"got {self.process_id!r}")
        if self.num_processes > 1:
            host, sep, port = self.coordinator.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"DistributedConfig.coordinator must be host:port when "
                                 f"num_processes > 1, got {self.coordinator!r}")
        if not isinstance(self.local_cpu_devices, int) or self.local_cpu_devices < 0:
            raise ValueError(f"DistributedConfig.local_cpu_devices must be an int >= 0, "
                             f"got {self.local_cpu_devices!r}")
        if not isinstance(self.timeout_s, int) or self.timeout_s < 1:
            raise ValueError(f"DistributedConfig.timeout_s must be an int >= 1, got {self.timeout_s!r}")

    @property
    def enabled(self) -> bool:
        return self.num_processes > 1
