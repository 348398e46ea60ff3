"""From finished GRPO groups to one learner `Batch` (pure functions, no I/O).

Steps: drop infra-error samples (never scored, DESIGN rule 3), compute group-relative
advantages on the training reward by the learner's estimator name, skip groups whose samples
all scored the same (zero advantage: no signal, only cost), then flatten each trajectory with
`rollout.api.token_stream` — the one place the loss mask is made — and pad into a bucketed
`learner.api.Batch`. The learner never sees turns, roles or protobuf.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from learner import advantages as adv
from learner.api import Batch
from rollout.api import Trajectory, token_stream


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    batch: Batch | None  # None when every group was skipped
    trajectories: list[Trajectory]  # the ones in the batch, in row order
    metrics: dict[str, float]


def make_batch(groups: list[list[Trajectory]], estimator: str, row_multiple: int,
               skip_zero_advantage: bool = True) -> BatchPlan:
    """`groups` holds scored trajectories only, one list per GRPO group."""
    groups = [g for g in groups if g]
    if not groups:
        return BatchPlan(None, [], {"batch/groups": 0.0, "batch/skipped_groups": 0.0})
    flat = [t for g in groups for t in g]
    rewards = np.array([t.reward for t in flat], np.float64)
    group_ids = np.array([i for i, g in enumerate(groups) for _ in g])
    advantages = adv.group_advantages(estimator, rewards, group_ids)
    constant = adv.constant_groups(rewards, group_ids)
    keep = ~constant if skip_zero_advantage else np.ones(len(flat), bool)
    kept = [t for t, k in zip(flat, keep) if k]
    metrics = {
        "batch/groups": float(len(groups)),
        "batch/skipped_groups": float(len(set(group_ids[~keep].tolist()))),
        "batch/trajectories": float(len(kept)),
        "batch/advantage_abs_mean": float(np.abs(advantages[keep]).mean()) if keep.any() else 0.0,
    }
    if not kept:
        return BatchPlan(None, [], metrics)
    streams = [token_stream(t) for t in kept]
    batch = Batch.from_sequences(
        tokens=[s.tokens for s in streams],
        loss_masks=[s.loss_mask for s in streams],
        behaviour_logprobs=[s.behaviour_logprobs for s in streams],
        advantages=[np.float32(a) for a in advantages[keep]],
        versions=[s.versions.astype(np.int32) for s in streams],
        row_multiple=row_multiple,
    )
    metrics["batch/rows"] = float(batch.num_rows)
    metrics["batch/tokens_per_row"] = float(batch.num_tokens)
    return BatchPlan(batch, kept, metrics)


def informative_groups(groups: list[list[Trajectory]]) -> list[list[Trajectory]]:
    """The non-empty groups whose samples did not all score the same (GRPO signal)."""
    groups = [g for g in groups if g]
    if not groups:
        return []
    rewards = np.array([t.reward for g in groups for t in g], np.float64)
    group_ids = np.array([i for i, g in enumerate(groups) for _ in g])
    constant = adv.constant_groups(rewards, group_ids)
    first_row = np.cumsum([0] + [len(g) for g in groups[:-1]])
    return [g for g, row in zip(groups, first_row) if not constant[row]]


def make_minibatches(groups: list[list[Trajectory]], estimator: str, row_multiple: int, minibatches: int,
                     skip_zero_advantage: bool = True) -> list[BatchPlan]:
    """The step's groups as `minibatches` learner batches, one optimiser update each (PPO-style).

    Groups are split whole, so every group's advantages are computed within the group exactly as
    in one big batch; later updates see ratios away from 1 and the clip keeps them near the data.
    Constant groups are dropped first, so each minibatch carries signal.
    """
    groups = informative_groups(groups) if skip_zero_advantage else [g for g in groups if g]
    chunks = [groups[i::minibatches] for i in range(minibatches)]
    plans = [make_batch(chunk, estimator, row_multiple, skip_zero_advantage) for chunk in chunks if chunk]
    return [p for p in plans if p.batch is not None]
