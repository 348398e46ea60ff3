"""The pure train step: `train_step(state, batch, hparams) -> (state, metrics)`.

What it is: the forward pass (policy logprobs at the sampling temperature, entropy,
reference logprobs, PPO values and in-step GAE), the loss from learner/loss.py, gradient
accumulation over microbatches with `lax.scan`, the optax update, and a guard that leaves
the state untouched when the loss or gradients are not finite. `sft_step` is the same step
with the `sft` objective; `policy_logprobs` is the forward half alone.

What it is not: jit or placement. learner/learner.py jits these once with explicit
shardings and donation; nothing here does I/O, logging, or Python branching on values.

Alignment: index t is token t everywhere (learner/api.py). The model's logits at position
t - 1 predict token t, so per-token quantities are computed on `logits[:, :-1]` against
`tokens[:, 1:]` and shifted right by one (column 0 is 0 and always masked out).

Microbatching: rows are dealt to microbatches round-robin (row i -> microbatch i % m), so
each device keeps its own rows and no all-to-all is needed. Loss normalisers are counted on
the whole batch first (learner/loss.py's additivity invariant), so the summed microbatch
gradients equal the full-batch gradient.

Value head (PPO): the learner reads the final hidden state (the LM head's input) from
`model.decoder.forward_with_hidden` and applies its own zero-initialised linear layer
`V = h . w + b`. Values are float32.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from learner import loss as loss_lib
from learner.state import OptimizerSpec, TrainState, make_optimizer
from model import decoder
from model.config import ModelConfig

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class StepHParams:
    """Everything static the step needs (hashable: part of the jit cache key)."""

    model: ModelConfig
    """Model config with the learner's compute dtype applied."""
    loss: loss_lib.LossHParams
    optimizer: OptimizerSpec
    microbatches: int = 1
    temperature: float = 1.0
    use_reference: bool = False
    use_value_head: bool = False
    gamma: float = 1.0
    gae_lambda: float = 0.95


# --------------------------------------------------------------------------- forward


def _shift_right(x_bt: jax.Array) -> jax.Array:
    """[b, t-1] values for tokens 1..t-1 -> [b, t] aligned to tokens (column 0 = 0)."""
    return jnp.pad(x_bt, ((0, 0), (1, 0)))


def token_logprobs_and_entropy(logits_btv: jax.Array, tokens_bt: jax.Array,
                               temperature: float) -> tuple[jax.Array, jax.Array]:
    """Token-aligned [b, t] logprobs (model.decoder's definition) and entropies."""
    logits = logits_btv[:, :-1]
    logp_bt = decoder.logprobs_from_logits(logits, tokens_bt[:, 1:], temperature)
    logp_btv = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    entropy_bt = -jnp.sum(jnp.exp(logp_btv) * logp_btv, axis=-1)
    return _shift_right(logp_bt), _shift_right(entropy_bt)


def policy_logprobs(params, batch: Batch, hp: StepHParams) -> jax.Array:
    """Token-aligned logprobs [b, t] of `batch['tokens_bt']` under `params` (0 off mask)."""
    logits = decoder.forward(params, hp.model, batch["tokens_bt"],
                             attention_mask_bt=batch["attention_mask_bt"])
    logp_bt, _ = token_logprobs_and_entropy(logits, batch["tokens_bt"], hp.temperature)
    return logp_bt * batch["attention_mask_bt"].astype(jnp.float32)


def gae_bt(rewards_bt, values_bt, mask_bt, gamma: float, lam: float):
    """GAE over policy tokens, all rows at once (scan over t, reversed); masked tokens are
    transparent. Equals `learner.advantages.gae` row by row. Returns (advantages, returns)."""
    def back(carry, xs):
        next_value, next_adv = carry
        reward, value, mask = xs
        delta = reward + gamma * next_value - value
        adv = delta + gamma * lam * next_adv
        on = mask > 0
        carry = (jnp.where(on, value, next_value), jnp.where(on, adv, next_adv))
        return carry, jnp.where(on, adv, 0.0)

    zeros_b = jnp.zeros(rewards_bt.shape[:1], jnp.float32)
    xs = (rewards_bt.T, values_bt.T, mask_bt.T)
    _, adv_tb = jax.lax.scan(back, (zeros_b, zeros_b), xs, reverse=True)
    adv_bt = adv_tb.T
    return adv_bt, jnp.where(mask_bt > 0, adv_bt + values_bt, 0.0)


# --------------------------------------------------------------------------- loss


def batch_counts(batch: Batch) -> tuple[jax.Array, jax.Array]:
    """(token_count, sequence_count) over the whole batch, each >= 1."""
    mask_bt = batch["loss_mask_bt"]
    tokens = jnp.maximum(jnp.sum(mask_bt), 1.0)
    sequences = jnp.maximum(jnp.sum((jnp.sum(mask_bt, axis=-1) > 0).astype(jnp.float32)), 1.0)
    return tokens, sequences


def microbatch_loss(trainable, ref_params, batch: Batch, counts, hp: StepHParams
                    ) -> tuple[jax.Array, Metrics]:
    """Loss and metrics of one microbatch, normalised by whole-batch `counts`."""
    tokens_bt, attention_bt = batch["tokens_bt"], batch["attention_mask_bt"]
    mask_bt = batch["loss_mask_bt"]
    if hp.use_value_head:
        logits, hidden_btd = decoder.forward_with_hidden(trainable["policy"], hp.model, tokens_bt,
                                                         attention_mask_bt=attention_bt)
        head = trainable["value_head"]
        values = hidden_btd[:, :-1].astype(jnp.float32) @ head["kernel"][:, 0] + head["bias"][0]
        values_bt = _shift_right(values)  # V(state before token t) for token t
    else:
        logits = decoder.forward(trainable["policy"], hp.model, tokens_bt,
                                 attention_mask_bt=attention_bt)
        values_bt = None
    logp_bt, entropy_bt = token_logprobs_and_entropy(logits, tokens_bt, hp.temperature)

    ref_bt = None
    if hp.use_reference:
        ref_bt = jax.lax.stop_gradient(policy_logprobs(ref_params, batch, hp))
    proximal_bt = batch.get("proximal_logprobs_bt")
    if proximal_bt is None:
        proximal_bt = jax.lax.stop_gradient(logp_bt)
    advantages_bt, returns_bt = batch["advantages_bt"], None
    if hp.use_value_head:
        advantages_bt, returns_bt = gae_bt(batch["rewards_bt"], jax.lax.stop_gradient(values_bt),
                                           mask_bt, hp.gamma, hp.gae_lambda)

    inputs = loss_lib.LossInputs(
        logprobs_bt=logp_bt, behaviour_logprobs_bt=batch["behaviour_logprobs_bt"],
        proximal_logprobs_bt=proximal_bt, advantages_bt=advantages_bt, loss_mask_bt=mask_bt,
        entropy_bt=entropy_bt, token_count=counts[0], sequence_count=counts[1],
        ref_logprobs_bt=ref_bt, values_bt=values_bt, returns_bt=returns_bt)
    loss, metrics = loss_lib.total_loss(inputs, hp.loss)
    gap_bt = jnp.abs(batch["behaviour_logprobs_bt"] - jax.lax.stop_gradient(logp_bt)) * mask_bt
    metrics["learner/logprob_gap"] = loss_lib.token_mean(gap_bt, inputs)
    metrics["learner/logprob_gap_max"] = jnp.max(gap_bt)
    if hp.use_value_head:
        metrics["learner/advantage_mean"] = loss_lib.token_mean(advantages_bt, inputs)
    return loss, metrics


def _split_microbatches(batch: Batch, m: int) -> Batch:
    """[b, ...] -> [m, b/m, ...], row i into microbatch i % m (keeps rows on their device)."""
    def split(x):
        rows = x.shape[0]
        y = jnp.swapaxes(x.reshape(rows // m, m, *x.shape[1:]), 0, 1)
        return nn.with_logical_constraint(y, (None, "batch") + (None,) * (x.ndim - 1))
    return jax.tree.map(split, batch)


def loss_and_grads(state: TrainState, batch: Batch, hp: StepHParams):
    """Summed (loss, metrics, grads) over microbatches; equals the full-batch values."""
    counts = batch_counts(batch)
    grad_fn = jax.value_and_grad(functools.partial(microbatch_loss, hp=hp), has_aux=True)
    trainable = state.trainable()
    if hp.microbatches == 1:
        (loss, metrics), grads = grad_fn(trainable, state.ref_params, batch, counts)
        return loss, metrics, grads

    micro = _split_microbatches(batch, hp.microbatches)
    first = jax.tree.map(lambda x: x[0], micro)
    (_, metric_shapes), _ = jax.eval_shape(grad_fn, trainable, state.ref_params, first,
                                           counts)
    init_metrics = {k: jnp.full(v.shape, -jnp.inf if k.endswith("_max") else 0.0, v.dtype)
                    for k, v in metric_shapes.items()}
    init = (jnp.zeros((), jnp.float32), init_metrics,
            jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), trainable))

    def body(carry, mb):
        loss_sum, metric_acc, grad_acc = carry
        (loss, metrics), grads = grad_fn(trainable, state.ref_params, mb, counts)
        metric_acc = {k: jnp.maximum(metric_acc[k], v) if k.endswith("_max")
                      else metric_acc[k] + v for k, v in metrics.items()}
        return (loss_sum + loss, metric_acc, jax.tree.map(jnp.add, grad_acc, grads)), None

    (loss, metrics, grads), _ = jax.lax.scan(body, init, micro)
    return loss, metrics, grads


def _all_finite(*values) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in values]))


def train_step(state: TrainState, batch: Batch, hp: StepHParams) -> tuple[TrainState, Metrics]:
    """One optimiser update on `batch`. A non-finite loss or gradient norm leaves the state
    as it was and sets `learner/skipped` to 1 (the shell raises on it by default)."""
    rng, _ = jax.random.split(state.rng)  # nothing in the step is random yet
    loss, metrics, grads = loss_and_grads(state, batch, hp)
    grad_norm = optax.tree.norm(grads)
    optimizer = make_optimizer(hp.optimizer)
    trainable = state.trainable()
    updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    updated = state.replace(step=state.step + 1, params=trainable["policy"],
                            value_head=trainable["value_head"], opt_state=opt_state, rng=rng)
    ok = _all_finite(loss, grad_norm)
    new_state = jax.tree.map(lambda new, old: jnp.where(ok, new, old), updated, state)
    metrics = {**metrics,
               "learner/loss": loss,
               "learner/grad_norm": grad_norm,
               "learner/learning_rate": hp.optimizer.learning_rate_at(state.step),
               "learner/tokens": batch_counts(batch)[0],
               "learner/skipped": 1.0 - ok.astype(jnp.float32)}
    return new_state, metrics


def sft_hparams(hp: StepHParams) -> StepHParams:
    """The supervised variant: 'sft' objective, temperature 1, no reference, no value head."""
    return dataclasses.replace(hp, loss=dataclasses.replace(hp.loss, loss="sft", kl_coef=0.0,
                                                            entropy_coef=0.0),
                               temperature=1.0, use_reference=False, use_value_head=False)


def sft_step(state: TrainState, batch: Batch, hp: StepHParams) -> tuple[TrainState, Metrics]:
    """Cross-entropy on `loss_mask_bt` tokens (demonstrations), same optimiser and masks."""
    return train_step(state, batch, sft_hparams(hp))


def abstract_batch(rows: int, cols: int, fields: tuple[str, ...]) -> dict[str, Any]:
    """ShapeDtypeStructs of a device batch (for ahead-of-time lowering in the benchmark)."""
    ints = ("tokens_bt", "attention_mask_bt", "versions_bt")
    return {name: jax.ShapeDtypeStruct((rows, cols), jnp.int32 if name in ints else jnp.float32)
            for name in fields}
