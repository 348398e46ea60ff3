"""Advantage estimators: hand-computed cases, GAE scan == loop, and a Monte Carlo proof
that per-turn credit assignment is unbiased.

Proves: GRPO / Dr. GRPO / RLOO / all-equal groups / per-turn returns / GAE match their
formulas (arithmetic in comments); the in-step `gae_bt` scan equals the numpy loop; on a
two-turn task with known values the per-turn RLOO advantage has the expected mean in every
(turn, state, action) cell and its policy gradient is unbiased, while crediting a process
reward to the wrong turn is detected.
Run: `.venv/bin/python -m pytest tests/learner/test_advantages.py -q`
"""

import numpy as np
import pytest

from learner import advantages as A
from learner.step import gae_bt


def test_grpo_dr_grpo_rloo_by_hand():
    # Group 7: rewards [1, 0, 0, 1] -> mean 0.5, population std 0.5
    #   grpo    = (r - 0.5) / (0.5 + 1e-6) ~ [1, -1, -1, 1]
    #   dr_grpo = r - 0.5 = [0.5, -0.5, -0.5, 0.5]
    #   rloo    = r - mean(others): 1 - 1/3 = 2/3; 0 - 2/3 = -2/3
    # Group 3 (size 1): every estimator gives 0.
    returns = np.array([1.0, 0.0, 0.0, 1.0, 5.0])
    groups = np.array([7, 7, 7, 7, 3])
    np.testing.assert_allclose(A.group_advantages("grpo", returns, groups),
                               [1, -1, -1, 1, 0], atol=1e-5)
    np.testing.assert_allclose(A.group_advantages("dr_grpo", returns, groups),
                               [0.5, -0.5, -0.5, 0.5, 0], atol=1e-7)
    np.testing.assert_allclose(A.group_advantages("rloo", returns, groups),
                               [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0], atol=1e-6)
    with pytest.raises(ValueError, match=r"\['dr_grpo', 'grpo', 'rloo'\]"):
        A.group_advantages("vtrace", returns, groups)


def test_constant_groups():
    # group a: all 1 -> constant; group b: 0 and 1 -> informative
    returns = np.array([1.0, 1.0, 0.0, 1.0])
    groups = np.array(["a", "a", "b", "b"])
    assert A.constant_groups(returns, groups).tolist() == [True, True, False, False]
    assert np.all(A.group_advantages("grpo", returns, groups)[:2] == 0)


def test_turn_returns_and_broadcast():
    # rewards per turn [0.1, 0, 1], gamma 0.5:
    #   G2 = 1; G1 = 0 + 0.5 * 1 = 0.5; G0 = 0.1 + 0.5 * 0.5 = 0.35
    np.testing.assert_allclose(A.turn_returns([0.1, 0.0, 1.0], 0.5), [0.35, 0.5, 1.0])
    # tokens: prompt(-1) turn0 turn0 tool(-1) turn1 -> values [3, 3, 0, 4] after prompt
    np.testing.assert_allclose(A.broadcast_turns([3.0, 4.0], [-1, 0, 0, -1, 1]),
                               [0, 3, 3, 0, 4])


def test_turn_advantages_by_hand():
    # Group g, two trajectories, gamma 1:
    #   i0 turns rewards [1, 0] -> returns [1, 0];  i1 rewards [0, 0, 2] -> returns [2, 2, 2]
    # rloo per turn index: turn0: 1 - 2 = -1, 2 - 1 = 1; turn1: 0 - 2 = -2, 2 - 0 = 2;
    # turn2: only i1 reached it -> group of one -> 0.
    out = A.turn_advantages("rloo", [np.array([1.0, 0.0]), np.array([0.0, 0.0, 2.0])],
                            ["g", "g"])
    np.testing.assert_allclose(out[0], [-1, -2])
    np.testing.assert_allclose(out[1], [1, 2, 0])
    # One turn, outcome reward only: identical to group_advantages.
    single = A.turn_advantages("grpo", [np.array([r]) for r in (1.0, 0.0, 0.0)], [1, 1, 1])
    np.testing.assert_allclose(np.concatenate(single),
                               A.group_advantages("grpo", np.array([1.0, 0, 0]), [1, 1, 1]))


def test_gae_by_hand():
    # rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 1, lambda 1:
    #   A2 = 1 - 0.7 = 0.3; A1 = (0 + 0.7 - 0.6) + 0.3 = 0.4; A0 = (0.6 - 0.5) + 0.4 = 0.5
    #   returns = A + V = [1, 1, 1]
    adv, ret = A.gae([0, 0, 1], [0.5, 0.6, 0.7], [1, 1, 1], 1.0, 1.0)
    np.testing.assert_allclose(adv, [0.5, 0.4, 0.3], atol=1e-6)
    np.testing.assert_allclose(ret, [1, 1, 1], atol=1e-6)
    # A tool token (mask 0) between two policy tokens is transparent; its value is ignored:
    #   A2 = 1 - 0.7 = 0.3; A0 = (0 + 0.7 - 0.5) + 0.3 = 0.5; A1 = 0
    adv, _ = A.gae([0, 0, 1], [0.5, 9.0, 0.7], [1, 0, 1], 1.0, 1.0)
    np.testing.assert_allclose(adv, [0.5, 0.0, 0.3], atol=1e-6)
    # gamma 0.9, lambda 0.5, one step back from a terminal reward 1 with V = [0, 0]:
    #   A1 = 1; A0 = (0 + 0.9 * 0 - 0) + 0.9 * 0.5 * 1 = 0.45
    adv, _ = A.gae([0, 1], [0, 0], [1, 1], 0.9, 0.5)
    np.testing.assert_allclose(adv, [0.45, 1.0], atol=1e-6)


def test_gae_scan_equals_loop():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(5, 13)).astype(np.float32)
    values = rng.normal(size=(5, 13)).astype(np.float32)
    mask = (rng.random((5, 13)) > 0.3).astype(np.float32)
    rewards *= mask
    adv, ret = gae_bt(rewards, values, mask, 0.97, 0.9)
    for b in range(5):
        want_adv, want_ret = A.gae(rewards[b], values[b], mask[b], 0.97, 0.9)
        np.testing.assert_allclose(np.asarray(adv)[b], want_adv, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(ret)[b], want_ret, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- Monte Carlo
#
# A two-turn agent task with known values. Turn 0 (state: the prompt): pick a0 in {0,1,2}
# with softmax(theta0); process reward R0[a0] + noise (e.g. a tool call's partial credit).
# Turn 1 (state: a0): pick a1 in {0,1} with softmax(theta1[a0]); outcome reward
# R1[a0, a1] + noise. Exact values:
#   V1(s) = sum_a pi1(a|s) R1[s, a]          Q0(a0) = R0[a0] + gamma V1(a0)
# With RLOO per turn index, the baseline is the mean return of the *other* group members at
# that turn, so E[A_hat_u | s_u, a_u] = Q_u(s_u, a_u) - E[G_u]:
#   turn 0: Q0(a0) - sum_a pi0(a) Q0(a)       turn 1: R1[s, a1] - sum_s pi0(s) V1(s)
# and with gamma = 1 the estimate sum_u A_hat_u grad log pi(a_u | s_u) is unbiased for
# grad J, J = E[r0 + r1]:
#   dJ/dtheta0[k]    = pi0[k] (Q0[k] - V0)
#   dJ/dtheta1[s, k] = pi0[s] pi1[k|s] (R1[s, k] - V1(s))

R0 = np.array([0.3, -0.2, 0.5])
R1 = np.array([[1.0, 0.0], [0.2, 0.8], [-0.5, 0.4]])
THETA0 = np.array([0.2, -0.1, 0.4])
THETA1 = np.array([[0.5, -0.5], [0.0, 0.3], [-0.2, 0.1]])


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _simulate(groups, group_size, gamma, seed, credit_process_to_last=False):
    rng = np.random.default_rng(seed)
    pi0, pi1 = _softmax(THETA0), _softmax(THETA1)
    n = groups * group_size
    a0 = rng.choice(3, size=n, p=pi0)
    a1 = (rng.random(n) < pi1[a0, 1]).astype(int)
    r0 = R0[a0] + rng.normal(0, 0.5, n)
    r1 = R1[a0, a1] + rng.normal(0, 0.5, n)
    if credit_process_to_last:  # the bug this guards against: reward on the wrong turn
        turn_rewards = [np.array([0.0, r0[i] + r1[i]]) for i in range(n)]
    else:
        turn_rewards = [np.array([r0[i], r1[i]]) for i in range(n)]
    group_ids = np.repeat(np.arange(groups), group_size)
    adv = np.stack(A.turn_advantages("rloo", turn_rewards, group_ids, gamma))
    return a0, a1, adv


def _expected(gamma):
    pi0, pi1 = _softmax(THETA0), _softmax(THETA1)
    v1 = (pi1 * R1).sum(-1)
    q0 = R0 + gamma * v1
    return q0 - pi0 @ q0, R1 - pi0 @ v1, pi0, pi1, q0, v1


def _cell_z_scores(a0, a1, adv, gamma):
    want0, want1, *_ = _expected(gamma)
    z = []
    for s in range(3):
        cell = adv[a0 == s, 0]
        z.append((cell.mean() - want0[s]) / (cell.std() / np.sqrt(len(cell))))
        for k in range(2):
            cell = adv[(a0 == s) & (a1 == k), 1]
            z.append((cell.mean() - want1[s, k]) / (cell.std() / np.sqrt(len(cell))))
    return np.abs(np.array(z))


def test_per_turn_advantage_is_unbiased_monte_carlo():
    gamma = 0.9
    a0, a1, adv = _simulate(groups=15000, group_size=4, gamma=gamma, seed=1)
    z = _cell_z_scores(a0, a1, adv, gamma)
    # 9 cells, each mean within 4.5 standard errors of the exact value (false alarm ~1e-4).
    assert z.max() < 4.5, z

    # Crediting the turn-0 process reward to turn 1 biases turn 1's cells far beyond noise.
    a0w, a1w, advw = _simulate(groups=15000, group_size=4, gamma=gamma, seed=1,
                               credit_process_to_last=True)
    assert _cell_z_scores(a0w, a1w, advw, gamma).max() > 10


def test_per_turn_policy_gradient_is_unbiased_monte_carlo():
    a0, a1, adv = _simulate(groups=15000, group_size=4, gamma=1.0, seed=2)
    _, _, pi0, pi1, q0, v1 = _expected(1.0)
    n = len(a0)
    # grad log softmax: onehot(a) - pi
    g0 = (np.eye(3)[a0] - pi0) * adv[:, :1]                        # [n, 3]
    g1 = np.zeros((n, 3, 2))
    g1[np.arange(n), a0] = (np.eye(2)[a1] - pi1[a0]) * adv[:, 1:]  # [n, 3, 2]
    samples = np.concatenate([g0, g1.reshape(n, 6)], axis=1)
    # Samples within a group share a baseline, so use per-group sums for the standard error.
    per_group = samples.reshape(-1, 4, samples.shape[1]).sum(1) / 4
    mean = per_group.mean(0)
    se = per_group.std(0) / np.sqrt(len(per_group))
    exact = np.concatenate([pi0 * (q0 - pi0 @ q0),
                            (pi0[:, None] * pi1 * (R1 - v1[:, None])).reshape(6)])
    assert np.abs((mean - exact) / se).max() < 4.5, (mean, exact, se)
