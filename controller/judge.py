"""Judgements of run health from the metric history: is the reward still measuring real success?

Pure functions over plain numbers and the per-step metric rows (`{"step": s, "reward/mean": ...}`)
the trackers write; no I/O, no state. The loop computes `reward/true_metric_corr` per step with
`reward_true_metric_corr`; `ConsoleTracker` and `report.write_report` ask
`reward_hacking_warning` about the history (DESIGN.md rule 7).

The reward-hacking rule. Take the last `window` steps that logged both `reward/mean` and
`reward/true_metric`; with fewer than `min_steps` of them, say nothing. Then warn if either
  1. "reward rose while the true metric fell": over those steps the least-squares line of
     `reward/mean` rises by at least `min_change` while that of `reward/true_metric` falls by at
     least `min_change` (change = slope x steps spanned; a fit, so one noisy step cannot trigger it);
  2. "reward and true metric decorrelated": the mean of the per-step, per-trajectory correlation
     `reward/true_metric_corr` over the window (steps where it was defined, at least `min_steps`
     of them) is below `corr_threshold`. If the run does not log that correlation, the
     correlation across steps of `reward/mean` and `reward/true_metric` is used instead, and only
     when the reward's fitted change is at least `min_change` (a flat reward says nothing).
Rule 1 is checked first; the message names the rule, the numbers and the steps.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

REWARD = "reward/mean"
TRUE_METRIC = "reward/true_metric"
CORRELATION = "reward/true_metric_corr"
KEYS = (REWARD, TRUE_METRIC, CORRELATION)  # everything reward_hacking_warning reads

DEFAULT_WINDOW = 20
DEFAULT_MIN_STEPS = 8
DEFAULT_MIN_CHANGE = 0.05
DEFAULT_CORR_THRESHOLD = 0.3


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation of paired samples; None when undefined (< 2 pairs or a constant side)."""
    if len(xs) != len(ys):
        raise ValueError(f"pearson: need paired samples, got {len(xs)} and {len(ys)}")
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 1e-24 or syy <= 1e-24:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def reward_true_metric_corr(rewards: Sequence[float], true_metrics: Sequence[float]) -> float | None:
    """`reward/true_metric_corr` of one step: over that step's trajectories, (reward, true metric)
    pairs. None when undefined (e.g. every trajectory got the same reward): then do not log it."""
    return pearson(rewards, true_metrics)


def fitted_change(steps: Sequence[float], values: Sequence[float]) -> float | None:
    """How much the least-squares line through (step, value) rises from the first step to the last."""
    if len(steps) < 2 or len(steps) != len(values):
        return None
    n = len(steps)
    ms, mv = sum(steps) / n, sum(values) / n
    sss = sum((s - ms) ** 2 for s in steps)
    if sss == 0:
        return None
    slope = sum((s - ms) * (v - mv) for s, v in zip(steps, values)) / sss
    return slope * (max(steps) - min(steps))


def window_corr(history: Sequence[Mapping[str, float]], window: int = DEFAULT_WINDOW) -> float | None:
    """Correlation across the last `window` steps of the per-step means `reward/mean` and `reward/true_metric`."""
    rows = _paired_rows(history, window)
    return pearson([r[REWARD] for r in rows], [r[TRUE_METRIC] for r in rows])


def reward_hacking_warning(
    history: Sequence[Mapping[str, float]],
    window: int = DEFAULT_WINDOW,
    min_steps: int = DEFAULT_MIN_STEPS,
    min_change: float = DEFAULT_MIN_CHANGE,
    corr_threshold: float = DEFAULT_CORR_THRESHOLD,
) -> str | None:
    """A one-line warning when the reward has stopped tracking the true metric (rule in the module docstring)."""
    rows = _paired_rows(history, window)
    if len(rows) < min_steps:
        return None
    steps = [float(r["step"]) for r in rows]
    span = f"steps {int(steps[0])}-{int(steps[-1])}"
    reward_change = fitted_change(steps, [r[REWARD] for r in rows])
    true_change = fitted_change(steps, [r[TRUE_METRIC] for r in rows])
    if reward_change is None or true_change is None:
        return None
    if reward_change >= min_change and true_change <= -min_change:
        return (f"reward rose while the true metric fell: reward {reward_change:+.3f}, "
                f"true metric {true_change:+.3f} over {span} (least-squares fit); possible reward hacking")
    correlations = [float(r[CORRELATION]) for r in rows if finite(r.get(CORRELATION))]
    if correlations:
        if len(correlations) >= min_steps:
            mean = sum(correlations) / len(correlations)
            if mean < corr_threshold:
                return (f"reward and true metric decorrelated: mean per-step correlation {mean:.2f} "
                        f"< {corr_threshold:.2f} over {span}; possible reward hacking")
        return None
    if abs(reward_change) >= min_change:
        corr = pearson([r[REWARD] for r in rows], [r[TRUE_METRIC] for r in rows])
        if corr is not None and corr < corr_threshold:
            return (f"reward and true metric decorrelated: correlation across steps {corr:.2f} "
                    f"< {corr_threshold:.2f} over {span}; possible reward hacking")
    return None


def finite(value) -> bool:
    """A real number: not None, not NaN, not infinite."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def _paired_rows(history: Sequence[Mapping[str, float]], window: int) -> list[Mapping[str, float]]:
    """The last `window` rows with finite `reward/mean` and `reward/true_metric`, in order."""
    rows = [r for r in history if finite(r.get(REWARD)) and finite(r.get(TRUE_METRIC))]
    return rows[-window:]
