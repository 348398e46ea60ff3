"""Per-step rollout metrics from finished trajectories (pure functions, no I/O).

The names are DESIGN.md section 6's. Success is the held-out true metric, never the reward:
`rollout/success_rate` is the mean `true_metric`, `reward/mean` the mean training reward,
and `reward/true_metric_corr` their Pearson correlation across this step's trajectories (not
logged when either is constant: no evidence either way, see `controller.judge`). Infra-error trajectories are counted under
`infra/errors/<class>` and excluded from every other number.
"""

from __future__ import annotations

import collections
from typing import Iterable, Mapping

import numpy as np

from controller.judge import reward_true_metric_corr
from rollout.api import EnvTurn, Termination, Trajectory
from sandbox.api import InfraErrorClass


def split_infra(trajectories: Iterable[Trajectory]) -> tuple[list[Trajectory], collections.Counter]:
    """Scored trajectories, and a count of the others by infra-error class."""
    scored, errors = [], collections.Counter()
    for t in trajectories:
        if t.infra_error is not InfraErrorClass.NONE or t.termination is Termination.INFRA_ERROR:
            errors[t.infra_error.value] += 1
        else:
            scored.append(t)
    return scored, errors


def rollout_metrics(trajectories: list[Trajectory], learner_version: int, prefix: str = "rollout") -> dict[str, float]:
    """Headline numbers of one batch of scored trajectories."""
    if not trajectories:
        return {f"{prefix}/count": 0.0}
    rewards = np.array([t.reward for t in trajectories], np.float64)
    truth = np.array([t.true_metric for t in trajectories], np.float64)
    env_turns = [[turn for turn in t.turns if isinstance(turn, EnvTurn)] for t in trajectories]
    staleness = np.array([learner_version - t.min_version() for t in trajectories if t.min_version() >= 0])
    metrics = {
        f"{prefix}/count": float(len(trajectories)),
        f"{prefix}/success_rate": float(truth.mean()),
        f"{prefix}/verify_pass_rate": float(np.mean([t.reward_components.get("outcome", 0.0) > 0 for t in trajectories])),
        f"{prefix}/turns": float(np.mean([len(t.policy_turns) for t in trajectories])),
        f"{prefix}/tokens": float(np.mean([len(t.prompt_ids) + sum(len(x.token_ids) for x in t.turns) for t in trajectories])),
        f"{prefix}/policy_tokens": float(np.mean([t.num_policy_tokens for t in trajectories])),
        f"{prefix}/tool_calls": float(np.mean([sum(e.tool_call is not None for e in turns) for turns in env_turns])),
        f"{prefix}/invalid_calls": float(np.mean([sum(bool(e.invalid_call) for e in turns) for turns in env_turns])),
        f"{prefix}/tool_cost": float(np.mean([sum(e.result.cost for e in turns) for turns in env_turns])),
        f"{prefix}/invalid_loop_rate": float(np.mean([t.termination is Termination.INVALID_LOOP for t in trajectories])),
        f"{prefix}/safety_violations": float(np.mean([len(t.safety_violations) for t in trajectories])),
        f"{prefix}/generate_s": float(np.mean([t.timings.generate_s for t in trajectories])),
        f"{prefix}/tools_s": float(np.mean([t.timings.tools_s for t in trajectories])),
    }
    if prefix == "rollout":
        metrics["reward/mean"] = float(rewards.mean())
        metrics["reward/std"] = float(rewards.std())
        metrics["reward/true_metric"] = float(truth.mean())
        corr = reward_true_metric_corr(rewards.tolist(), truth.tolist())
        if corr is not None:
            metrics["reward/true_metric_corr"] = corr
        if len(staleness):
            metrics["staleness/mean"] = float(staleness.mean())
            metrics["staleness/max"] = float(staleness.max())
    return metrics


def infra_metrics(errors: Mapping[str, int]) -> dict[str, float]:
    return {f"infra/errors/{name}": float(count) for name, count in sorted(errors.items())}


def staleness_histogram(trajectories: Iterable[Trajectory], learner_version: int) -> dict[int, int]:
    """How many trajectories were how many versions behind the learner when trained on."""
    counts = collections.Counter(learner_version - t.min_version() for t in trajectories if t.min_version() >= 0)
    return dict(sorted(counts.items()))
