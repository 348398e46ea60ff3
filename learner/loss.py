"""Objectives: pure jnp functions over `LossInputs`, selected by name.

What it is:
- `LossInputs`, the per-token arrays one objective sees (shape-annotated, aligned so index t
  is *token t*: its logprob, its advantage, whether it is a policy token);
- the policy objectives in `LOSSES` (`grpo`, `ppo`, `reinforce`, `sft`), each
  `fn(inputs, hparams) -> (loss, metrics)`; `total_loss` adds the KL and entropy terms;
- off-policy correction (`importance`): `none`, `tis`, `decoupled`;
- the KL estimators `k1`, `k2`, `k3` (Schulman 2020, "Approximating KL divergence") as a loss
  term, and `kl_reward_penalty` for the reward-penalty mode the controller applies;
- the aggregation modes `token_mean`, `seq_mean`, `seq_mean_token_sum`.

What it is not: the forward pass or the optimiser (learner/step.py). No I/O, no Python
branching on array values: everything here traces under jit.

Additivity invariant (why `token_count` / `sequence_count` are inputs): every loss and
metric here is a *sum over tokens* divided by a normaliser counted over the **whole batch**.
Splitting the batch into microbatches and adding their losses, gradients and metrics
therefore gives exactly the full-batch numbers (tests/learner/test_step.py checks it).
Metrics whose key ends in `_max` combine by max instead.

The clipped surrogate, with r_t = pi_theta(t) / pi_old(t), A_t the advantage, w_t the
off-policy weight (stop-gradient):

    loss_t = -w_t * min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)

PPO (Schulman et al. 2017) and GRPO use eps_low = eps_high; DAPO (Yu et al. 2025) raises
eps_high ("clip-higher") and aggregates by `token_mean`. What pi_old and w_t are depends on
`importance`:

    none       pi_old = behaviour (the sampler's logprobs)        w = 1
    tis        pi_old = proximal                                  w = min(pi_prox / pi_behav, cap)
    decoupled  pi_old = proximal                                  w = pi_prox / pi_behav, and 0
                                                                  where that exceeds cap

`tis` is truncated importance sampling (Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training"); `decoupled` is AReaL's decoupled PPO objective
(Fu et al. 2025), which drops tokens whose behaviour weight is too large instead of
truncating them. The proximal policy is the learner's policy before this update: the train
step uses stop_gradient(current logprobs) unless the batch carries proximal logprobs
(computed once before several updates on one rollout batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp

Metrics = dict[str, jax.Array]
Objective = Callable[["LossInputs", "LossHParams"], tuple[jax.Array, Metrics]]

AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean", "seq_mean_token_sum")
IMPORTANCE: tuple[str, ...] = ("none", "tis", "decoupled")
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
KL_MODES: tuple[str, ...] = ("loss", "reward")

_LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: keeps k3 and importance ratios finite in float32


@flax.struct.dataclass
class LossInputs:
    """Per-token inputs, [b, t], index t = token t. Everything off `loss_mask_bt` is ignored."""

    logprobs_bt: jax.Array
    """log pi_theta(token t | tokens < t), temperature-scaled; gradients flow through this."""
    behaviour_logprobs_bt: jax.Array
    """Logprob of token t under the policy that sampled it (rollout engine), 0 off mask."""
    proximal_logprobs_bt: jax.Array
    """Logprob under the policy before this update (stop-gradient); see module docstring."""
    advantages_bt: jax.Array
    """Advantage credited to token t (0 off mask)."""
    loss_mask_bt: jax.Array
    """1.0 where token t is a policy token, else 0.0 (prompt, tool output, padding)."""
    entropy_bt: jax.Array
    """Entropy of the temperature-scaled distribution that token t was drawn from."""
    token_count: jax.Array
    """Scalar: policy tokens in the whole batch (>= 1). Normaliser for token means."""
    sequence_count: jax.Array
    """Scalar: rows with at least one policy token in the whole batch (>= 1)."""
    ref_logprobs_bt: jax.Array | None = None
    """Logprob of token t under the frozen reference policy; None when KL is off."""
    values_bt: jax.Array | None = None
    """Value-head prediction at token t (PPO only)."""
    returns_bt: jax.Array | None = None
    """Value target at token t (PPO: GAE advantages + old values; stop-gradient)."""


@dataclasses.dataclass(frozen=True)
class LossHParams:
    """The scalars the objectives read; static under jit (hashable), built by LearnerConfig."""

    loss: str = "grpo"
    aggregation: str = "token_mean"
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    importance: str = "none"
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_mode: str = "loss"
    entropy_coef: float = 0.0
    value_coef: float = 0.5


# --------------------------------------------------------------------------- building blocks


def aggregate(x_bt: jax.Array, inputs: LossInputs, mode: str) -> jax.Array:
    """Reduce a per-token quantity to a scalar with whole-batch normalisers.

    token_mean          sum_bt x m / token_count                 (DAPO: every token equal)
    seq_mean            sum_b [sum_t x m / sum_t m] / sequence_count  (GRPO paper: every
                        sequence equal, so long answers' tokens weigh less)
    seq_mean_token_sum  sum_bt x m / sequence_count              (Dr. GRPO-style: no
                        per-length division; the scale grows with length)
    """
    mask_bt = inputs.loss_mask_bt
    if mode == "token_mean":
        return jnp.sum(x_bt * mask_bt) / inputs.token_count
    if mode == "seq_mean":
        per_row = jnp.sum(x_bt * mask_bt, axis=-1) / jnp.maximum(jnp.sum(mask_bt, axis=-1), 1.0)
        return jnp.sum(per_row) / inputs.sequence_count
    if mode == "seq_mean_token_sum":
        return jnp.sum(x_bt * mask_bt) / inputs.sequence_count
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")


def token_mean(x_bt: jax.Array, inputs: LossInputs) -> jax.Array:
    """Metric helper: mean over the batch's policy tokens (additive over microbatches)."""
    return aggregate(x_bt, inputs, "token_mean")


def _clamp(log_ratio: jax.Array) -> jax.Array:
    return jnp.clip(log_ratio, -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)


def policy_ratio_and_weight(inputs: LossInputs, hp: LossHParams) -> tuple[jax.Array, jax.Array]:
    """(r_bt = pi_theta / pi_old, w_bt off-policy weight, stop-gradient); see module table."""
    if hp.importance == "none":
        old_bt = inputs.behaviour_logprobs_bt
        weight_bt = jnp.ones_like(old_bt)
    elif hp.importance in ("tis", "decoupled"):
        old_bt = inputs.proximal_logprobs_bt
        weight_bt = jnp.exp(_clamp(old_bt - inputs.behaviour_logprobs_bt))
        if hp.importance == "tis":
            weight_bt = jnp.minimum(weight_bt, hp.tis_cap)
        else:
            weight_bt = jnp.where(weight_bt <= hp.tis_cap, weight_bt, 0.0)
    else:
        raise ValueError(f"importance must be one of {IMPORTANCE}, got {hp.importance!r}")
    ratio_bt = jnp.exp(_clamp(inputs.logprobs_bt - jax.lax.stop_gradient(old_bt)))
    return ratio_bt, jax.lax.stop_gradient(weight_bt) * inputs.loss_mask_bt


def kl_bt(logprobs_bt: jax.Array, ref_logprobs_bt: jax.Array, estimator: str) -> jax.Array:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta.

    With x = log pi_ref - log pi_theta at the sampled token:
        k1 = -x                 unbiased, high variance, can be negative
        k2 = x^2 / 2            biased, low variance, >= 0
        k3 = exp(x) - 1 - x     unbiased, low variance, >= 0 (GRPO's choice)
    """
    x = _clamp(ref_logprobs_bt - logprobs_bt)
    if estimator == "k1":
        return -x
    if estimator == "k2":
        return 0.5 * x * x
    if estimator == "k3":
        return jnp.exp(x) - 1.0 - x
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def kl_reward_penalty(logprobs_bt, ref_logprobs_bt, loss_mask_bt, coef: float,
                      estimator: str = "k1"):
    """kl_mode='reward': per-token penalty coef * k(t) (0 off mask) that the controller
    subtracts from the rewards before computing advantages (InstructGPT-style). Works on
    numpy or jnp arrays; get the logprobs from `Learner.compute_logprobs`."""
    penalty = kl_bt(jnp.asarray(logprobs_bt), jnp.asarray(ref_logprobs_bt), estimator)
    return coef * penalty * jnp.asarray(loss_mask_bt)


# --------------------------------------------------------------------------- objectives

LOSSES: dict[str, Objective] = {}


def register_loss(name: str) -> Callable[[Objective], Objective]:
    """Add an objective to `LOSSES` under `name` (tunix `function_registry` style)."""
    def wrap(fn: Objective) -> Objective:
        if name in LOSSES:
            raise ValueError(f"loss {name!r} is already registered")
        LOSSES[name] = fn
        return fn
    return wrap


def get_loss(name: str) -> Objective:
    if name not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {name!r}")
    return LOSSES[name]


@register_loss("grpo")
def clipped_surrogate(inputs: LossInputs, hp: LossHParams) -> tuple[jax.Array, Metrics]:
    """The PPO/GRPO/DAPO clipped surrogate (module docstring), no value term."""
    ratio_bt, weight_bt = policy_ratio_and_weight(inputs, hp)
    adv_bt = inputs.advantages_bt
    clipped_ratio_bt = jnp.clip(ratio_bt, 1.0 - hp.clip_eps_low, 1.0 + hp.clip_eps_high)
    surrogate_bt = jnp.minimum(ratio_bt * adv_bt, clipped_ratio_bt * adv_bt)
    loss = aggregate(-weight_bt * surrogate_bt, inputs, hp.aggregation)
    # A token is clipped when the min picks the clipped branch *and* that branch has no
    # gradient: above 1+eps_high with A > 0, or below 1-eps_low with A < 0.
    clipped_bt = ((ratio_bt > 1.0 + hp.clip_eps_high) & (adv_bt > 0)) | \
                 ((ratio_bt < 1.0 - hp.clip_eps_low) & (adv_bt < 0))
    metrics = {
        "learner/pg_loss": loss,
        "learner/clip_frac": token_mean(clipped_bt.astype(jnp.float32), inputs),
        "learner/ratio_mean": token_mean(ratio_bt, inputs),
        "learner/importance_weight_mean": token_mean(weight_bt, inputs),
    }
    return loss, metrics


@register_loss("reinforce")
def reinforce(inputs: LossInputs, hp: LossHParams) -> tuple[jax.Array, Metrics]:
    """Importance-weighted policy gradient without clipping: -w r A (RLOO's objective).

    On-policy (r = 1 in value) its gradient is -A grad log pi, the REINFORCE estimator.
    """
    ratio_bt, weight_bt = policy_ratio_and_weight(inputs, hp)
    loss = aggregate(-weight_bt * ratio_bt * inputs.advantages_bt, inputs, hp.aggregation)
    metrics = {
        "learner/pg_loss": loss,
        "learner/clip_frac": jnp.zeros((), jnp.float32),
        "learner/ratio_mean": token_mean(ratio_bt, inputs),
        "learner/importance_weight_mean": token_mean(weight_bt, inputs),
    }
    return loss, metrics


@register_loss("ppo")
def ppo(inputs: LossInputs, hp: LossHParams) -> tuple[jax.Array, Metrics]:
    """Clipped surrogate plus value_coef * (V - R)^2 / 2 on the same tokens and aggregation.

    No value clipping: each rollout batch gets one update, so the "old" values equal the
    current ones and PPO's value clip would be a no-op.
    """
    if inputs.values_bt is None or inputs.returns_bt is None:
        raise ValueError("loss 'ppo' needs values_bt and returns_bt (advantage='gae')")
    loss, metrics = clipped_surrogate(inputs, hp)
    value_loss = aggregate(0.5 * jnp.square(inputs.values_bt - inputs.returns_bt), inputs,
                           hp.aggregation)
    metrics = {**metrics, "learner/value_loss": value_loss,
               "learner/value_mean": token_mean(inputs.values_bt, inputs)}
    return loss + hp.value_coef * value_loss, metrics


@register_loss("sft")
def sft(inputs: LossInputs, hp: LossHParams) -> tuple[jax.Array, Metrics]:
    """Cross-entropy -log pi(token t) on the masked tokens (warm starts on demonstrations)."""
    loss = aggregate(-inputs.logprobs_bt, inputs, hp.aggregation)
    return loss, {"learner/sft_loss": loss}


LOSS_NAMES: tuple[str, ...] = tuple(LOSSES)


def total_loss(inputs: LossInputs, hp: LossHParams) -> tuple[jax.Array, Metrics]:
    """The objective `hp.loss` + kl_coef * KL (kl_mode 'loss') - entropy_coef * entropy."""
    loss, metrics = get_loss(hp.loss)(inputs, hp)
    if inputs.ref_logprobs_bt is not None:
        kl = aggregate(kl_bt(inputs.logprobs_bt, inputs.ref_logprobs_bt, hp.kl_estimator),
                       inputs, hp.aggregation)
        metrics["learner/kl"] = kl
        if hp.kl_mode == "loss" and hp.kl_coef:
            loss = loss + hp.kl_coef * kl
    entropy = aggregate(inputs.entropy_bt, inputs, hp.aggregation)
    metrics["learner/entropy"] = entropy
    if hp.entropy_coef:
        loss = loss - hp.entropy_coef * entropy
    metrics["learner/loss"] = loss
    return loss, metrics
