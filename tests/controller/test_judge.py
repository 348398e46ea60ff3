"""controller.judge: correlations and the reward-hacking rule on tiny hand-computed histories.

Each case's arithmetic is in its comment. Run: `.venv/bin/python -m pytest tests/controller/test_judge.py`.
"""

import math

import pytest

from controller import judge


def rows(rewards, trues, corrs=None, first_step=1):
    out = []
    for i, (r, t) in enumerate(zip(rewards, trues)):
        row = {"step": first_step + i, "reward/mean": r, "reward/true_metric": t}
        if corrs is not None and corrs[i] is not None:
            row["reward/true_metric_corr"] = corrs[i]
        out.append(row)
    return out


def test_pearson_hand_computed():
    # x = 1,2,3,4 (mean 2.5), y = 1,3,2,4 (mean 2.5): dx = dy' = (-1.5,-.5,.5,1.5), dy = (-1.5,.5,-.5,1.5)
    # sum dx*dy = 2.25 - .25 - .25 + 2.25 = 4; sum dx^2 = sum dy^2 = 5 -> r = 4/5 = 0.8
    assert judge.pearson([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert judge.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert judge.pearson([1, 2, 3], [5, 5, 5]) is None  # constant side: undefined
    assert judge.pearson([1], [1]) is None
    with pytest.raises(ValueError):
        judge.pearson([1, 2], [1])


def test_step_correlation_from_trajectory_pairs():
    # rewards (1,0,1,0) mean .5; true (1,0,0,0) mean .25; sum dx*dy = .375+.125-.125+.125 = .5,
    # sum dx^2 = 1, sum dy^2 = .5625 + 3 * .0625 = .75 -> r = .5 / sqrt(.75) = 1/sqrt(3)
    assert judge.reward_true_metric_corr([1, 0, 1, 0], [1, 0, 0, 0]) == pytest.approx(1 / math.sqrt(3))
    assert judge.reward_true_metric_corr([1, 1, 1], [1, 0, 1]) is None  # one reward for the whole group


def test_fitted_change_hand_computed():
    # steps 0..3 (mean 1.5), values 0,1,0,1 (mean .5): slope = (.75 - .25 - .25 + .75) / 5 = .2, over 3 steps = .6
    assert judge.fitted_change([0, 1, 2, 3], [0, 1, 0, 1]) == pytest.approx(0.6)
    assert judge.fitted_change([5], [1]) is None


def test_window_correlation_uses_only_the_last_window_steps():
    history = rows([1, 2, 3, 4, 1, 2, 3, 4], [4, 3, 2, 1, 1, 3, 2, 4])
    assert judge.window_corr(history, window=4) == pytest.approx(0.8)  # the pearson case above
    assert judge.window_corr(history[:4], window=4) == pytest.approx(-1.0)


def test_reward_up_true_metric_down_warns():
    # reward = .1 * step over steps 1..10: fitted change .1 * 9 = +.9; true = .5 - .02 * step: -.02 * 9 = -.18
    history = rows([0.1 * s for s in range(1, 11)], [0.5 - 0.02 * s for s in range(1, 11)])
    assert judge.reward_hacking_warning(history) == (
        "reward rose while the true metric fell: reward +0.900, true metric -0.180 over steps 1-10 "
        "(least-squares fit); possible reward hacking")


def test_both_rising_is_healthy():
    history = rows([0.1 * s for s in range(1, 11)], [0.08 * s for s in range(1, 11)], corrs=[0.9] * 10)
    assert judge.reward_hacking_warning(history) is None


def test_too_few_steps_says_nothing():
    history = rows([0.1 * s for s in range(1, 8)], [1 - 0.1 * s for s in range(1, 8)])  # 7 < min_steps 8
    assert judge.reward_hacking_warning(history) is None


def test_low_per_step_correlation_warns():
    # flat trends, but within each step the reward no longer tracks the true metric: mean corr .1 < .3
    history = rows([0.5] * 10, [0.5] * 10, corrs=[0.1] * 10)
    assert judge.reward_hacking_warning(history) == (
        "reward and true metric decorrelated: mean per-step correlation 0.10 < 0.30 over steps 1-10; "
        "possible reward hacking")
    # defined on only 5 steps (< min_steps): not enough evidence
    assert judge.reward_hacking_warning(rows([0.5] * 10, [0.5] * 10, corrs=[0.1] * 5 + [None] * 5)) is None


def test_correlation_across_steps_when_per_step_corr_is_not_logged():
    # reward .1 * step (steps 1..10, dx = step - 5.5); true alternates .5, .6 (dy = -.05, +.05, ...):
    # sum dx*dy = .25, sum dx^2 = 82.5, sum dy^2 = .025 -> r = .25 / sqrt(2.0625) = .174 < .3;
    # true's fitted change = .25 / 82.5 * 9 = +.027, so rule 1 does not fire.
    history = rows([0.1 * s for s in range(1, 11)], [0.5, 0.6] * 5)
    assert judge.reward_hacking_warning(history) == (
        "reward and true metric decorrelated: correlation across steps 0.17 < 0.30 over steps 1-10; "
        "possible reward hacking")
    # a flat reward says nothing about hacking, however noisy the true metric
    assert judge.reward_hacking_warning(rows([0.5] * 10, [0.5, 0.6] * 5)) is None


def test_only_the_window_counts_and_missing_values_are_skipped():
    bad = rows([0.1 * s for s in range(1, 21)], [1 - 0.05 * s for s in range(1, 21)])
    good = rows([0.5 + 0.01 * s for s in range(10)], [0.4 + 0.01 * s for s in range(10)], first_step=21)
    assert judge.reward_hacking_warning(bad + good, window=20) is not None
    assert judge.reward_hacking_warning(bad + good, window=10) is None
    holes = bad + [{"step": 21, "reward/mean": float("nan"), "reward/true_metric": 0.0}, {"step": 22}]
    assert judge.reward_hacking_warning(holes) == judge.reward_hacking_warning(bad)
