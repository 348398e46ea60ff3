"""LearnerConfig validation and the optimiser schedule.

Proves: bad choices fail at construction with the field, the rule and the valid options;
the warm-up + cosine schedule hits its documented values.
Run: `.venv/bin/python -m pytest tests/learner/test_learner_config.py -q`
"""

import pytest

from learner.config import LearnerConfig


def test_choice_errors_list_options():
    with pytest.raises(ValueError, match=r"LearnerConfig.loss must be one of .*'grpo'.*'dpo'"):
        LearnerConfig(loss="dpo")
    with pytest.raises(ValueError, match=r"aggregation must be one of \['token_mean', "
                                         r"'seq_mean', 'seq_mean_token_sum'\]"):
        LearnerConfig(aggregation="sum")
    with pytest.raises(ValueError, match=r"importance must be one of \['none', 'tis', "
                                         r"'decoupled'\], got 'is'"):
        LearnerConfig(importance="is")


def test_rules():
    with pytest.raises(ValueError, match="learning_rate must be a positive number, got 0"):
        LearnerConfig(learning_rate=0)
    with pytest.raises(ValueError, match="loss 'ppo' and advantage 'gae' go together"):
        LearnerConfig(loss="ppo")
    with pytest.raises(ValueError, match="microbatches must be an int >= 1, got 0"):
        LearnerConfig(microbatches=0)
    with pytest.raises(ValueError, match="total_steps must exceed warmup_steps"):
        LearnerConfig(schedule="cosine", warmup_steps=10, total_steps=10)
    assert LearnerConfig(loss="ppo", advantage="gae").uses_value_head
    assert LearnerConfig(kl_coef=0.01).uses_reference and not LearnerConfig().uses_reference


def test_warmup_cosine_schedule():
    # lr 1.0, warm-up 4: updates 0..3 get 0.25, 0.5, 0.75, 1.0.
    # cosine over updates 4..14 (span 10) down to 0.1: at step 9 (halfway)
    # 0.1 + 0.9 * 0.5 * (1 + cos(pi / 2)) = 0.55; at 14 and beyond: 0.1.
    spec = LearnerConfig(learning_rate=1.0, warmup_steps=4, schedule="cosine",
                         total_steps=14, min_lr_ratio=0.1).optimizer_spec()
    got = [float(spec.learning_rate_at(s)) for s in (0, 1, 3, 9, 14, 100)]
    assert got == pytest.approx([0.25, 0.5, 1.0, 0.55, 0.1, 0.1], rel=1e-6)
