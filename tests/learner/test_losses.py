"""Hand-computed cases for every objective, correction, KL estimator and aggregation.

Proves: learner/loss.py computes the documented formulas (arithmetic in the comments),
including DAPO's asymmetric clip, TIS truncation vs decoupled dropping, k1/k2/k3, the
entropy bonus, the PPO value term, SFT cross-entropy and the normalisers.
Run: `.venv/bin/python -m pytest tests/learner/test_losses.py -q`
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from learner import loss as L


def make_inputs(ratio, adv, mask, *, behaviour=None, proximal=None, ref=None, entropy=None,
                values=None, returns=None):
    """One or more rows; logprobs = behaviour + log(ratio), so pi/pi_behaviour = ratio."""
    mask = jnp.asarray(mask, jnp.float32)
    behaviour = jnp.full(mask.shape, -1.0) if behaviour is None else jnp.asarray(behaviour)
    logprobs = behaviour + jnp.log(jnp.asarray(ratio, jnp.float32))
    tokens = jnp.maximum(jnp.sum(mask), 1.0)
    sequences = jnp.maximum(jnp.sum(jnp.sum(mask, -1) > 0), 1.0)
    return L.LossInputs(
        logprobs_bt=logprobs, behaviour_logprobs_bt=behaviour,
        proximal_logprobs_bt=logprobs if proximal is None else jnp.asarray(proximal),
        advantages_bt=jnp.asarray(adv, jnp.float32), loss_mask_bt=mask,
        entropy_bt=jnp.zeros(mask.shape) if entropy is None else jnp.asarray(entropy),
        token_count=tokens, sequence_count=sequences,
        ref_logprobs_bt=None if ref is None else jnp.asarray(ref),
        values_bt=None if values is None else jnp.asarray(values),
        returns_bt=None if returns is None else jnp.asarray(returns))


# Token 0 is never a policy token; tokens 1..3 are.
RATIO = [[1.0, 1.5, 0.5, 1.1]]
ADV = [[9.0, 1.0, -1.0, 2.0]]
MASK = [[0.0, 1.0, 1.0, 1.0]]


def test_dapo_asymmetric_clip_token_mean():
    # eps_low 0.2, eps_high 0.28:
    # t1: r=1.5, A=+1: min(1.5*1, 1.28*1) = 1.28  (clipped above)
    # t2: r=0.5, A=-1: min(-0.5, 0.8*-1) = -0.8   (clipped below)
    # t3: r=1.1, A=+2: min(2.2, 2.2) = 2.2
    # loss = -(1.28 - 0.8 + 2.2) / 3 = -0.893333; clip_frac = 2/3
    hp = L.LossHParams(loss="grpo", clip_eps_low=0.2, clip_eps_high=0.28)
    loss, m = L.clipped_surrogate(make_inputs(RATIO, ADV, MASK), hp)
    assert float(loss) == pytest.approx(-(1.28 - 0.8 + 2.2) / 3, rel=1e-6)
    assert float(m["learner/clip_frac"]) == pytest.approx(2 / 3, rel=1e-6)


def test_symmetric_clip_changes_only_the_upper_branch():
    # eps 0.2 both sides: t1 becomes min(1.5, 1.2) = 1.2; t2, t3 as before.
    # loss = -(1.2 - 0.8 + 2.2) / 3 = -0.866667
    hp = L.LossHParams(loss="grpo", clip_eps_low=0.2, clip_eps_high=0.2)
    loss, _ = L.clipped_surrogate(make_inputs(RATIO, ADV, MASK), hp)
    assert float(loss) == pytest.approx(-2.6 / 3, rel=1e-6)


def test_aggregation_modes():
    # Per-token values x (only masked ones count):
    #   row 0: mask [0,1,1,1], x = [_, 1, 2, 3] -> sum 6, mean 2
    #   row 1: mask [0,1,0,0], x = [_, 10, _, _] -> sum 10, mean 10
    #   row 2: all masked out (padding row: does not count as a sequence)
    # token_mean         = (6 + 10) / 4 = 4
    # seq_mean           = (2 + 10) / 2 = 6
    # seq_mean_token_sum = (6 + 10) / 2 = 8
    mask = [[0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]]
    x = jnp.asarray([[7, 1, 2, 3], [7, 10, 7, 7], [7, 7, 7, 7]], jnp.float32)
    inputs = make_inputs(np.ones((3, 4)), np.zeros((3, 4)), mask)
    assert float(L.aggregate(x, inputs, "token_mean")) == pytest.approx(4.0)
    assert float(L.aggregate(x, inputs, "seq_mean")) == pytest.approx(6.0)
    assert float(L.aggregate(x, inputs, "seq_mean_token_sum")) == pytest.approx(8.0)
    with pytest.raises(ValueError, match="token_mean"):
        L.aggregate(x, inputs, "bogus")


def test_tis_truncates_and_decoupled_drops():
    # behaviour = -1, proximal = -1 + log 3 -> pi_prox / pi_behav = 3 on every token.
    # Current = proximal (first update), so r = 1 and the surrogate is A per token.
    # A = [_, 1, 1, 1], 3 tokens:
    #   tis (cap 2): w = min(3, 2) = 2 -> loss = -(2 + 2 + 2) / 3 = -2
    #   decoupled (cap 2): w = 3 > 2 -> dropped -> loss 0
    #   decoupled (cap 4): w = 3 -> loss = -3
    behaviour = np.full((1, 4), -1.0, np.float32)
    proximal = behaviour + math.log(3.0)
    inputs = make_inputs([[3.0] * 4], [[0, 1, 1, 1]], MASK, behaviour=behaviour,
                         proximal=proximal)
    tis, _ = L.clipped_surrogate(inputs, L.LossHParams(importance="tis", tis_cap=2.0))
    dropped, _ = L.clipped_surrogate(inputs, L.LossHParams(importance="decoupled", tis_cap=2.0))
    kept, _ = L.clipped_surrogate(inputs, L.LossHParams(importance="decoupled", tis_cap=4.0))
    assert float(tis) == pytest.approx(-2.0, rel=1e-6)
    assert float(dropped) == pytest.approx(0.0, abs=1e-7)
    assert float(kept) == pytest.approx(-3.0, rel=1e-6)


def test_decoupled_clips_against_proximal_not_behaviour():
    # pi/pi_prox = 1.5 (clipped at 1.2 for A>0), pi_prox/pi_behav = 1.25 (kept, cap 2):
    # loss = -1.25 * min(1.5, 1.2) * 1 = -1.5 on the single token.
    behaviour = np.full((1, 2), -2.0, np.float32)
    proximal = behaviour + math.log(1.25)
    logprobs = proximal + math.log(1.5)
    inputs = L.LossInputs(
        logprobs_bt=jnp.asarray(logprobs), behaviour_logprobs_bt=jnp.asarray(behaviour),
        proximal_logprobs_bt=jnp.asarray(proximal), advantages_bt=jnp.ones((1, 2)),
        loss_mask_bt=jnp.asarray([[0.0, 1.0]]), entropy_bt=jnp.zeros((1, 2)),
        token_count=jnp.float32(1), sequence_count=jnp.float32(1))
    loss, m = L.clipped_surrogate(inputs, L.LossHParams(importance="decoupled", tis_cap=2.0))
    assert float(loss) == pytest.approx(-1.5, rel=1e-6)
    assert float(m["learner/clip_frac"]) == pytest.approx(1.0)


def test_kl_estimators():
    # pi = 0.5, pi_ref = 0.25: x = log(0.25 / 0.5) = -ln 2 = -0.693147
    # k1 = -x = 0.693147;  k2 = x^2 / 2 = 0.240227;  k3 = e^x - 1 - x = 0.5 - 1 + 0.693147
    lp, ref = jnp.log(0.5), jnp.log(0.25)
    ln2 = math.log(2.0)
    assert float(L.kl_bt(lp, ref, "k1")) == pytest.approx(ln2, rel=1e-6)
    assert float(L.kl_bt(lp, ref, "k2")) == pytest.approx(ln2 ** 2 / 2, rel=1e-6)
    assert float(L.kl_bt(lp, ref, "k3")) == pytest.approx(ln2 - 0.5, rel=1e-6)
    with pytest.raises(ValueError, match="k3"):
        L.kl_bt(lp, ref, "k4")


def test_total_loss_adds_kl_and_entropy_terms():
    # One token: r = 1 (current == behaviour), A = 1 -> surrogate loss = -1.
    # KL k1 with pi = 0.5, pi_ref = 0.25: 0.693147; kl_coef 0.1 -> +0.0693147
    # entropy 2.0, entropy_coef 0.01 -> -0.02
    # total = -1 + 0.0693147 - 0.02 = -0.9506853
    inputs = make_inputs([[1.0, 1.0]], [[0.0, 1.0]], [[0.0, 1.0]],
                         behaviour=np.log([[0.5, 0.5]]), ref=np.log([[0.25, 0.25]]),
                         entropy=[[0.0, 2.0]])
    hp = L.LossHParams(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01)
    loss, m = L.total_loss(inputs, hp)
    assert float(loss) == pytest.approx(-1 + 0.1 * math.log(2) - 0.02, rel=1e-6)
    assert float(m["learner/kl"]) == pytest.approx(math.log(2), rel=1e-6)
    assert float(m["learner/entropy"]) == pytest.approx(2.0)
    # kl_mode='reward' reports KL but leaves it out of the loss: -1 - 0.02
    loss_r, _ = L.total_loss(inputs, L.LossHParams(kl_coef=0.1, kl_estimator="k1",
                                                   entropy_coef=0.01, kl_mode="reward"))
    assert float(loss_r) == pytest.approx(-1.02, rel=1e-6)


def test_kl_reward_penalty():
    # coef 0.5 * k1 = 0.5 * ln 2 on the policy token, 0 elsewhere.
    penalty = L.kl_reward_penalty(np.log([[0.5, 0.5]]), np.log([[0.25, 0.25]]),
                                  [[0.0, 1.0]], coef=0.5)
    np.testing.assert_allclose(np.asarray(penalty), [[0.0, 0.5 * math.log(2)]], rtol=1e-6)


def test_ppo_adds_value_loss():
    # Surrogate: one token, r = 1, A = 1 -> -1.
    # Value: V = 0.5, R = 1.5 -> (1)^2 / 2 = 0.5; value_coef 0.5 -> +0.25. Total -0.75.
    inputs = make_inputs([[1.0, 1.0]], [[0.0, 1.0]], [[0.0, 1.0]], values=[[0.0, 0.5]],
                         returns=[[0.0, 1.5]])
    loss, m = L.ppo(inputs, L.LossHParams(loss="ppo", value_coef=0.5))
    assert float(loss) == pytest.approx(-0.75, rel=1e-6)
    assert float(m["learner/value_loss"]) == pytest.approx(0.5, rel=1e-6)


def test_sft_is_masked_cross_entropy():
    # logprobs on the 2 policy tokens: log 0.5 and log 0.25 -> mean NLL = (ln2 + 2 ln2) / 2
    inputs = make_inputs([[1, 1, 1]], [[0, 0, 0]], [[0, 1, 1]],
                         behaviour=np.log([[0.9, 0.5, 0.25]]))
    loss, _ = L.sft(inputs, L.LossHParams(loss="sft"))
    assert float(loss) == pytest.approx(1.5 * math.log(2), rel=1e-6)


def test_reinforce_gradient_is_minus_advantage_over_tokens():
    # On-policy (old = behaviour = current): d loss / d logprob_t = -A_t / token_count.
    # A = [_, 1, -1, 2], 3 tokens -> grad = [0, -1/3, 1/3, -2/3].
    def f(lp):
        inputs = make_inputs(np.ones((1, 4)), ADV, MASK, behaviour=lp)
        inputs = inputs.replace(logprobs_bt=lp)
        return L.reinforce(inputs, L.LossHParams(loss="reinforce"))[0]
    grad = jax.grad(f)(jnp.full((1, 4), -1.0))
    np.testing.assert_allclose(np.asarray(grad), [[0, -1 / 3, 1 / 3, -2 / 3]], rtol=1e-6)


def test_registry_errors_list_options():
    with pytest.raises(ValueError, match=r"\['grpo', 'ppo', 'reinforce', 'sft'\]"):
        L.get_loss("dpo")
    assert set(L.LOSSES) == {"grpo", "ppo", "reinforce", "sft"}
