"""TrainState, the optimiser, and where every piece of state lives on the mesh.

What it is: `TrainState` (a pytree: step, params, value head, optimiser state, RNG, frozen
reference params), `OptimizerSpec` + `make_optimizer` (AdamW, linear warm-up then constant
or cosine, global-norm clipping), `init_train_state`, and `state_shardings`, which lays the
state out with the parameter rules of learner/sharding.py (optimiser moments and the
reference copy follow their parameters; scalars are replicated).

What it is not: the step (learner/step.py) or checkpoint I/O (learner/learner.py).

Invariants: parameters, optimiser state and the reference are float32 whatever the compute
dtype (bf16 compute casts inside the model). `rng` is a raw uint32 key (`jax.random.PRNGKey`
layout) so checkpoints hold plain arrays. Absent parts are empty: `value_head` is {} unless
loss='ppo', `ref_params` is None unless KL is used.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from learner import sharding as sh

Params = Any


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    """int32 scalar: optimiser updates applied so far."""
    params: Params
    """Policy parameters (model.decoder layout), float32 master copy."""
    value_head: Params
    """PPO value head {'kernel': [d, 1], 'bias': [1]}, or {} when unused."""
    opt_state: Any
    """optax state over {'policy': params, 'value_head': value_head}."""
    rng: jax.Array
    """uint32[2] key, split once per step."""
    ref_params: Params | None
    """Frozen reference policy for KL (a copy of the initial params), or None."""

    def trainable(self) -> dict[str, Params]:
        return {"policy": self.params, "value_head": self.value_head}


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """Optimiser scalars (static under jit); built by `LearnerConfig.optimizer_spec()`."""

    learning_rate: float = 5e-5
    warmup_steps: int = 0
    schedule: str = "constant"
    total_steps: int = 1000
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0

    def learning_rate_at(self, step: jax.Array | int) -> jax.Array:
        """LR for the update that follows `step` earlier updates.

        Warm-up is linear and reaches the peak on update `warmup_steps` - 1 (update 0 already
        moves, unlike optax's 0-based linear schedule); cosine then decays to
        min_lr_ratio * peak at `total_steps` and stays there."""
        step = jnp.asarray(step, jnp.float32)
        factor = jnp.ones((), jnp.float32)
        if self.warmup_steps:
            factor = jnp.minimum((step + 1.0) / self.warmup_steps, 1.0)
        if self.schedule == "cosine":
            span = max(self.total_steps - self.warmup_steps, 1)
            progress = jnp.clip((step - self.warmup_steps) / span, 0.0, 1.0)
            cosine = 0.5 * (1.0 + jnp.cos(math.pi * progress))
            factor = factor * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)
        return self.learning_rate * factor


def _decay_mask(tree: Any) -> Any:
    """Weight decay on matrices only: leaves named `kernel` or `embedding` (not norm scales,
    which are 2-D [l, d] after layer scanning, and not biases)."""
    def is_matrix(path, _):
        name = str(getattr(path[-1], "key", getattr(path[-1], "name", "")))
        return name.endswith("kernel") or name == "embedding"
    return jax.tree_util.tree_map_with_path(is_matrix, tree)


def make_optimizer(spec: OptimizerSpec) -> optax.GradientTransformation:
    """clip_by_global_norm -> AdamW(schedule), decoupled weight decay on matrices only."""
    parts = []
    if spec.max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(spec.max_grad_norm))
    parts.append(optax.adamw(learning_rate=spec.learning_rate_at, b1=spec.b1, b2=spec.b2,
                             eps=spec.eps, weight_decay=spec.weight_decay, mask=_decay_mask))
    return optax.chain(*parts)


def init_value_head(hidden_size: int) -> Params:
    """Zero-initialised linear on the final hidden state: V = h . kernel + bias."""
    return {"kernel": jnp.zeros((hidden_size, 1), jnp.float32),
            "bias": jnp.zeros((1,), jnp.float32)}


def init_train_state(params: Params, optimizer: optax.GradientTransformation, *, seed: int,
                     hidden_size: int, use_value_head: bool, use_reference: bool,
                     ref_params: Params | None = None) -> TrainState:
    """A fresh state (call under jit with out_shardings to build it directly on the mesh)."""
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    value_head = init_value_head(hidden_size) if use_value_head else {}
    reference = None
    if use_reference:
        source = params if ref_params is None else ref_params
        # A real copy: the live params are donated every step, the reference never is.
        reference = jax.tree.map(lambda x: jnp.array(x, jnp.float32, copy=True), source)
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, value_head=value_head,
        opt_state=optimizer.init({"policy": params, "value_head": value_head}),
        rng=jax.random.PRNGKey(seed), ref_params=reference)


def state_shardings(abstract_state: TrainState, mesh: Mesh, param_logical_axes: Any
                    ) -> TrainState:
    """NamedShardings for every leaf of a (possibly abstract) TrainState.

    Params and the reference use the parameter rules; an optimiser leaf takes its
    parameter's sharding when its path ends with that parameter's path and the shapes match
    (Adam's mu / nu), otherwise it is replicated (step counters, scalars)."""
    params = sh.param_shardings(mesh, param_logical_axes, abstract_state.params)
    rep = sh.replicated(mesh)
    by_path: dict[str, tuple[tuple[int, ...], NamedSharding]] = {}
    for prefix, tree, shards in (("['policy']", abstract_state.params, params),):
        for (path, leaf), shard in zip(jax.tree_util.tree_leaves_with_path(tree),
                                       jax.tree.leaves(shards)):
            by_path[prefix + jax.tree_util.keystr(path)] = (tuple(leaf.shape), shard)

    def opt_leaf(path, leaf):
        key = jax.tree_util.keystr(path)
        for suffix, (shape, shard) in by_path.items():
            if key.endswith(suffix) and tuple(leaf.shape) == shape:
                return shard
        return rep

    return TrainState(
        step=rep, params=params,
        value_head=jax.tree.map(lambda _: rep, abstract_state.value_head),
        opt_state=jax.tree_util.tree_map_with_path(opt_leaf, abstract_state.opt_state),
        rng=rep,
        ref_params=None if abstract_state.ref_params is None else params)
