"""Batch: bucketing, the token-t alignment checks, row padding.

Proves: `Batch.from_sequences` right-pads ragged sequences to power-of-two token buckets and
row buckets that divide by the data-parallel size, broadcasts sequence-level advantages to
policy tokens only, and rejects inputs that break the alignment convention.
Run: `.venv/bin/python -m pytest tests/learner/test_batch.py -q`
"""

import numpy as np
import pytest

from learner.api import Batch, bucket_rows, next_bucket


def test_from_sequences_pads_to_buckets():
    tokens = [np.arange(5), np.arange(9), np.arange(3)]
    masks = [np.array([0, 0, 1, 1, 1]), np.array([0] * 4 + [1] * 5), np.array([0, 1, 1])]
    logp = [-np.ones(5), -np.ones(9), -np.ones(3)]
    batch = Batch.from_sequences(tokens, masks, logp, [1.0, -1.0, np.array([0, 2.0, 3.0])],
                                 row_multiple=4, min_tokens=8)
    # longest 9 -> 12 columns (the half-octave bucket); 3 rows -> 4 (row_multiple 4 x 1)
    assert batch.tokens_bt.shape == (4, 12)
    assert batch.attention_mask_bt[1].tolist() == [1] * 9 + [0] * 3
    assert batch.attention_mask_bt[3].sum() == 0  # padding row
    # scalar advantage broadcast to policy tokens only
    assert batch.advantages_bt[0, :5].tolist() == [0, 0, 1, 1, 1]
    assert batch.advantages_bt[2, :3].tolist() == [0, 2, 3]
    assert batch.behaviour_logprobs_bt[0, :5].tolist() == [0, 0, -1, -1, -1]
    assert batch.num_policy_tokens == 3 + 5 + 2
    assert batch.tokens_bt.dtype == np.int32 and batch.loss_mask_bt.dtype == np.float32


def test_buckets_are_half_octaves():
    assert [next_bucket(n) for n in range(1, 26)] == [
        1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16, 16, 16, 16, 24, 24, 24, 24, 24, 24, 24, 24, 32]
    for n in range(1, 5000):  # smallest bucket >= n, and never more than 1.5x waste past 2
        bucket = next_bucket(n)
        assert bucket >= n and (n <= 2 or bucket < 1.5 * n)
        assert bucket & (bucket - 1) == 0 or (bucket % 3 == 0 and (bucket // 3) & (bucket // 3 - 1) == 0)


def test_bucket_rows():
    # row_multiple 8: 1..8 -> 8, 9..16 -> 16, 17..24 -> 24, 25..32 -> 32, 33..48 -> 48
    assert [bucket_rows(n, 8) for n in (1, 8, 9, 16, 17, 24, 25, 33)] == [8, 8, 16, 16, 24, 24, 32, 48]
    assert [bucket_rows(n, 3) for n in (1, 4, 7, 10)] == [3, 6, 9, 12]


def test_padded_rows_and_versions():
    batch = Batch.from_sequences([np.arange(4)], [np.array([0, 1, 1, 1])], [np.zeros(4)],
                                 [1.0], versions=[np.array([-1, 3, 3, 4])], min_tokens=4)
    out = batch.padded(4)
    assert out.tokens_bt.shape == (4, 4)
    assert out.versions_bt[1:].tolist() == [[-1] * 4] * 3
    assert out.padded(4) is out


def test_alignment_is_checked():
    with pytest.raises(ValueError, match=r"loss_mask_bt\[:, 0\] must be 0"):
        Batch.from_sequences([np.arange(3)], [np.array([1, 1, 1])], [np.zeros(3)], [1.0])
    with pytest.raises(ValueError, match=r"expected shape \(3,\)"):
        Batch.from_sequences([np.arange(3)], [np.array([0, 1])], [np.zeros(3)], [1.0])
    with pytest.raises(ValueError, match="rewards_bt must be 0 off loss_mask_bt"):
        Batch.from_sequences([np.arange(3)], [np.array([0, 1, 0])], [np.zeros(3)], [0.0],
                             rewards=[np.array([0, 0, 1.0])])
    ones = np.ones((2, 4))
    with pytest.raises(ValueError, match="padding token cannot be a policy token"):
        Batch(tokens_bt=ones, attention_mask_bt=np.zeros((2, 4)),
              loss_mask_bt=np.pad(np.ones((2, 3)), ((0, 0), (1, 0))),
              behaviour_logprobs_bt=ones, advantages_bt=ones)
