"""Advantage estimators: pure numpy functions over rewards, chosen by name.

What it is:
- group estimators (`ADVANTAGES`, picked with `group_advantages(name, ...)`): each sample's
  return is compared with the other samples of its group (same prompt):
  `grpo` (mean and std per group; Shao et al. 2024, DeepSeekMath), `dr_grpo` (mean only, no
  std scaling; Liu et al. 2025 "Understanding R1-Zero-like training"), `rloo` (leave-one-out
  mean; Ahmadian et al. 2024, Kool et al. 2019);
- `constant_groups`: which groups have all-equal returns (zero advantage: no signal, the
  controller may skip them, as DAPO's dynamic sampling does);
- multi-turn credit: `turn_returns` (discounted per-turn returns, each turn's process reward
  attached to the turn that earned it, the outcome reward to the last turn),
  `turn_advantages` (a group estimator applied per turn index) and `broadcast_turns` (turn
  values onto that turn's tokens);
- `gae` (generalised advantage estimation, Schulman et al. 2016) over the policy tokens of
  one sequence, the numpy reference for the in-step `learner.step.gae_bt`.

What it is not: the loss (learner/loss.py) and not jit code: these run on the host in the
controller before a `Batch` is built (except GAE, which needs the value head and so also
runs inside the train step).

Conventions: `n` flat samples, `g` groups, `u` turns, `t` tokens. A group is a set of
samples sharing a `group_id`; groups may be ragged (dropped infra errors shrink them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

GroupEstimator = Callable[[np.ndarray, np.ndarray], np.ndarray]

STD_EPS = 1e-6
"""Added to the group std in `grpo` so all-equal groups give 0, not NaN."""


def _group_index(group_ids_n: np.ndarray) -> tuple[np.ndarray, int]:
    _, inverse = np.unique(np.asarray(group_ids_n), return_inverse=True)
    return inverse.reshape(-1), int(inverse.max()) + 1 if inverse.size else 0


def _group_stats(returns_n: np.ndarray, group_ids_n: np.ndarray):
    returns_n = np.asarray(returns_n, dtype=np.float64)
    index_n, num_groups = _group_index(group_ids_n)
    count_g = np.bincount(index_n, minlength=num_groups).astype(np.float64)
    sum_g = np.bincount(index_n, weights=returns_n, minlength=num_groups)
    return returns_n, index_n, count_g, sum_g


def grpo(returns_n: np.ndarray, group_ids_n: np.ndarray) -> np.ndarray:
    """(r - mean_group) / (std_group + eps), population std (ddof=0) as in DeepSeekMath."""
    returns_n, index_n, count_g, sum_g = _group_stats(returns_n, group_ids_n)
    mean_g = sum_g / count_g
    centred_n = returns_n - mean_g[index_n]
    var_g = np.bincount(index_n, weights=centred_n ** 2, minlength=len(count_g)) / count_g
    return (centred_n / (np.sqrt(var_g)[index_n] + STD_EPS)).astype(np.float32)


def dr_grpo(returns_n: np.ndarray, group_ids_n: np.ndarray) -> np.ndarray:
    """r - mean_group: Dr. GRPO drops the std division (it over-weights easy/hard prompts)."""
    returns_n, index_n, count_g, sum_g = _group_stats(returns_n, group_ids_n)
    return (returns_n - (sum_g / count_g)[index_n]).astype(np.float32)


def rloo(returns_n: np.ndarray, group_ids_n: np.ndarray) -> np.ndarray:
    """r - mean of the *other* samples of the group (0 for a group of one).

    The baseline does not depend on the sample itself, so the policy gradient stays unbiased;
    it equals dr_grpo * n / (n - 1).
    """
    returns_n, index_n, count_g, sum_g = _group_stats(returns_n, group_ids_n)
    count_n = count_g[index_n]
    others_n = np.where(count_n > 1, count_n - 1, 1.0)
    baseline_n = (sum_g[index_n] - returns_n) / others_n
    return np.where(count_n > 1, returns_n - baseline_n, 0.0).astype(np.float32)


ADVANTAGES: dict[str, GroupEstimator] = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}
"""Group estimators by name. `gae` (PPO, value head) is computed in the train step instead."""

ADVANTAGE_NAMES: tuple[str, ...] = (*ADVANTAGES, "gae")
"""Every valid `LearnerConfig.advantage`."""


def group_advantages(name: str, returns_n: np.ndarray, group_ids_n: np.ndarray) -> np.ndarray:
    """Advantages [n] float32 with the group estimator `name`."""
    if name not in ADVANTAGES:
        raise ValueError(f"advantage must be one of {sorted(ADVANTAGES)} for group "
                         f"estimation, got {name!r}")
    returns_n = np.asarray(returns_n)
    if returns_n.shape != np.shape(group_ids_n) or returns_n.ndim != 1:
        raise ValueError(f"returns_n and group_ids_n must be equal 1-D shapes, got "
                         f"{returns_n.shape} and {np.shape(group_ids_n)}")
    return ADVANTAGES[name](returns_n, np.asarray(group_ids_n))


def constant_groups(returns_n: np.ndarray, group_ids_n: np.ndarray,
                    atol: float = 1e-8) -> np.ndarray:
    """Bool [n]: True where the sample's whole group has (near-)equal returns.

    Such samples get zero advantage under every group estimator: they cost compute and add
    no gradient, so the controller may drop them (DAPO's dynamic sampling).
    """
    returns_n = np.asarray(returns_n, dtype=np.float64)
    index_n, num_groups = _group_index(group_ids_n)
    max_g = np.full(num_groups, -np.inf)
    min_g = np.full(num_groups, np.inf)
    np.maximum.at(max_g, index_n, returns_n)
    np.minimum.at(min_g, index_n, returns_n)
    return (max_g - min_g)[index_n] <= atol


# --------------------------------------------------------------------------- multi-turn


def turn_returns(turn_rewards_u: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """Discounted return of each policy turn of one trajectory.

    `turn_rewards_u[u]` is the reward credited to policy turn u: its process reward (e.g. a
    verifier passing the code written in that turn, minus the tool cost of the call it made)
    and, for the last turn, the outcome reward. G_u = sum_{j >= u} gamma^(j - u) r_j, so a
    turn is credited with what it earned and what came after it, never with earlier rewards.
    """
    rewards_u = np.asarray(turn_rewards_u, dtype=np.float64)
    returns_u = np.zeros_like(rewards_u)
    running = 0.0
    for u in range(len(rewards_u) - 1, -1, -1):
        running = rewards_u[u] + gamma * running
        returns_u[u] = running
    return returns_u


def turn_advantages(name: str, turn_rewards: Sequence[np.ndarray], group_ids_n: Sequence,
                    gamma: float = 1.0) -> list[np.ndarray]:
    """Per-turn advantages for a batch of multi-turn trajectories.

    Each trajectory i has per-turn rewards `turn_rewards[i]` (ragged lengths). Returns are
    computed with `turn_returns`; then the group estimator `name` compares turn u of a
    trajectory with turn u of the other trajectories of its group that reached turn u.
    With `rloo` the baseline never uses the trajectory itself, so the per-turn policy
    gradient is unbiased (tests/learner/test_advantages.py checks it by Monte Carlo). With
    one turn and only an outcome reward this is exactly `group_advantages`.
    """
    returns = [turn_returns(r, gamma) for r in turn_rewards]
    flat_returns, flat_keys, owners = [], [], []
    for i, (returns_u, group) in enumerate(zip(returns, group_ids_n)):
        for u, value in enumerate(returns_u):
            flat_returns.append(value)
            flat_keys.append((group, u))
            owners.append((i, u))
    out = [np.zeros(len(r), dtype=np.float32) for r in returns]
    if not flat_returns:
        return out
    key_ids = {key: j for j, key in enumerate(dict.fromkeys(flat_keys))}
    flat_adv = group_advantages(name, np.asarray(flat_returns),
                                np.asarray([key_ids[k] for k in flat_keys]))
    for (i, u), value in zip(owners, flat_adv):
        out[i][u] = value
    return out


def broadcast_turns(turn_values_u: np.ndarray, turn_index_t: np.ndarray) -> np.ndarray:
    """Per-token values: token t gets `turn_values_u[turn_index_t[t]]`, or 0 where the index
    is negative (prompt, tool and environment tokens: they never get gradient anyway)."""
    turn_index_t = np.asarray(turn_index_t)
    values_u = np.asarray(turn_values_u, dtype=np.float32)
    safe_t = np.clip(turn_index_t, 0, max(len(values_u) - 1, 0))
    gathered = values_u[safe_t] if len(values_u) else np.zeros(turn_index_t.shape, np.float32)
    return np.where(turn_index_t >= 0, gathered, 0.0).astype(np.float32)


# --------------------------------------------------------------------------- GAE


def gae(rewards_t: np.ndarray, values_t: np.ndarray, mask_t: np.ndarray, gamma: float,
        lam: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE over the policy tokens (mask 1) of one sequence; other tokens are transparent.

    Time runs over policy tokens only: a tool output between two policy turns does not count
    as a step (gamma is per generated token, as in RLHF PPO), and the value after the last
    policy token is 0 (the episode ends). Rewards sit on policy tokens (the outcome reward
    on the last one). Returns (advantages_t, returns_t = advantages_t + values_t), 0 off mask.
    This loop is the reference that the in-step scan (`learner.step.gae_bt`) must equal.
    """
    rewards_t = np.asarray(rewards_t, np.float64)
    values_t = np.asarray(values_t, np.float64)
    mask_t = np.asarray(mask_t) > 0
    adv_t = np.zeros_like(rewards_t)
    next_value, next_adv = 0.0, 0.0
    for t in range(len(rewards_t) - 1, -1, -1):
        if not mask_t[t]:
            continue
        delta = rewards_t[t] + gamma * next_value - values_t[t]
        next_adv = delta + gamma * lam * next_adv
        next_value = values_t[t]
        adv_t[t] = next_adv
    returns_t = np.where(mask_t, adv_t + values_t, 0.0)
    return adv_t.astype(np.float32), returns_t.astype(np.float32)
