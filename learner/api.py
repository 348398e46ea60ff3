"""What the controller hands the learner: `Batch`, plain numpy, padded to shape buckets.

What it is: one dataclass of [b, t] numpy arrays plus `Batch.from_sequences`, which turns
ragged per-sequence arrays into right-padded buckets, so the jit-compiled step compiles
once per (rows, tokens) bucket rather than once per batch.

What it is not: a rollout or protobuf type. The controller flattens a `Trajectory` (prompt,
policy turns, tool turns) into one token sequence and builds the per-token arrays; the loss
mask comes from the trajectory's turn roles (one function, on the controller side), and
this file only checks it.

Alignment (the one convention everything here follows): index t is *token t*.
- `tokens_bt[b, t]`: the token at position t of row b (positions are 0..T-1, right-padded).
- `loss_mask_bt[b, t] = 1` iff token t is a policy token (sampled by the policy), so
  `loss_mask_bt[:, 0] == 0` always (nothing predicts the first token). The loss on token t
  uses the logits computed at position t - 1.
- `behaviour_logprobs_bt[b, t]`: log pi_behaviour(token t | tokens < t) at the sampling
  temperature, as the rollout engine recorded it; 0 where the mask is 0.
- `advantages_bt[b, t]`: the advantage credited to token t (0 off mask).
- `rewards_bt[b, t]` (PPO/GAE only): reward credited at token t, on policy tokens only (the
  outcome reward on the last policy token, a turn's process reward on that turn's last).
- `proximal_logprobs_bt` (optional): the learner's logprobs before this update, for several
  updates on one rollout batch (`Learner.compute_logprobs`); None means "this update's
  starting policy".
- `versions_bt` (optional): weight version that sampled token t, -1 off mask (metrics only).
Padding rows and columns have every mask 0 and contribute nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np



def next_power_of_two(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def next_bucket(n: int) -> int:
    """Smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k and 3 * 2^k) that is >= n.

    Half-octave buckets: a batch pads by less than 1.5x (2x with powers of two alone, which
    cost the demo's learner ~25% of its step on padding) for twice as many compiled shapes."""
    n = max(int(n), 1)
    power = next_power_of_two(n)
    three_quarters = 3 * power // 4
    return three_quarters if power >= 4 and n <= three_quarters else power


def bucket_rows(rows: int, row_multiple: int) -> int:
    """Rows padded to row_multiple * `next_bucket`: few distinct shapes, < 1.5x waste."""
    groups = math.ceil(max(rows, 1) / row_multiple)
    return row_multiple * next_bucket(groups)


@dataclasses.dataclass(frozen=True)
class Batch:
    """One learner batch of [b, t] numpy arrays (alignment in the module docstring)."""

    tokens_bt: np.ndarray
    """int32 token ids; padding is 0."""
    attention_mask_bt: np.ndarray
    """int32, 1 for real tokens (prompt, policy, tool), 0 for padding (right-padded)."""
    loss_mask_bt: np.ndarray
    """float32, 1 where token t is a policy token."""
    behaviour_logprobs_bt: np.ndarray
    """float32, sampler's logprob of token t (temperature-scaled), 0 off mask."""
    advantages_bt: np.ndarray
    """float32, advantage of token t, 0 off mask (ignored by loss 'ppo', which uses GAE)."""
    rewards_bt: np.ndarray | None = None
    """float32, reward credited at token t (loss 'ppo' only), 0 off mask."""
    proximal_logprobs_bt: np.ndarray | None = None
    """float32, learner logprobs before this update (importance 'tis'/'decoupled')."""
    versions_bt: np.ndarray | None = None
    """int32, weight version that sampled token t, -1 off mask (metrics only)."""

    def __post_init__(self) -> None:
        shape = np.shape(self.tokens_bt)
        if len(shape) != 2:
            raise ValueError(f"Batch.tokens_bt must be 2-D [b, t], got shape {shape}")
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if np.shape(value) != shape:
                raise ValueError(f"Batch.{field.name} must have shape {shape} like tokens_bt, "
                                 f"got {np.shape(value)}")
        mask = np.asarray(self.loss_mask_bt)
        if shape[1] and np.any(mask[:, 0] != 0):
            raise ValueError("Batch.loss_mask_bt[:, 0] must be 0: no logits predict the first "
                             "token (loss on token t uses the logits at t - 1)")
        if np.any((mask != 0) & (np.asarray(self.attention_mask_bt) == 0)):
            raise ValueError("Batch.loss_mask_bt must be 0 wherever attention_mask_bt is 0 "
                             "(a padding token cannot be a policy token)")
        if self.rewards_bt is not None and np.any((np.asarray(self.rewards_bt) != 0)
                                                  & (mask == 0)):
            raise ValueError("Batch.rewards_bt must be 0 off loss_mask_bt: credit rewards "
                             "to policy tokens (the last token of the turn that earned them)")

    # ------------------------------------------------------------------ shape

    @property
    def num_rows(self) -> int:
        return int(np.shape(self.tokens_bt)[0])

    @property
    def num_tokens(self) -> int:
        """Padded sequence length T."""
        return int(np.shape(self.tokens_bt)[1])

    @property
    def num_policy_tokens(self) -> int:
        return int(np.count_nonzero(self.loss_mask_bt))

    def arrays(self) -> dict[str, np.ndarray]:
        """The non-None fields as a dict, with canonical dtypes."""
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            dtype = np.int32 if field.name in ("tokens_bt", "attention_mask_bt",
                                               "versions_bt") else np.float32
            out[field.name] = np.asarray(value, dtype=dtype)
        return out

    def padded(self, row_multiple: int = 1, *, bucket: bool = True,
               num_tokens: int | None = None) -> Batch:
        """Rows padded (all-zero masks) to `bucket_rows` (or just a multiple of row_multiple
        with bucket=False); columns padded to `num_tokens` when given."""
        rows = bucket_rows(self.num_rows, row_multiple) if bucket else \
            row_multiple * math.ceil(self.num_rows / row_multiple)
        cols = self.num_tokens if num_tokens is None else num_tokens
        if cols < self.num_tokens:
            raise ValueError(f"Batch.padded num_tokens must be >= {self.num_tokens}, got {cols}")
        if rows == self.num_rows and cols == self.num_tokens:
            return self
        pads = {}
        for name, value in self.arrays().items():
            fill = -1 if name == "versions_bt" else 0
            pads[name] = np.pad(value, ((0, rows - self.num_rows), (0, cols - self.num_tokens)),
                                constant_values=fill)
        return Batch(**pads)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_sequences(
        cls,
        tokens: Sequence[np.ndarray],
        loss_masks: Sequence[np.ndarray],
        behaviour_logprobs: Sequence[np.ndarray],
        advantages: Sequence[np.ndarray | float],
        *,
        rewards: Sequence[np.ndarray] | None = None,
        proximal_logprobs: Sequence[np.ndarray] | None = None,
        versions: Sequence[np.ndarray] | None = None,
        row_multiple: int = 1,
        min_tokens: int = 16,
        bucket: bool = True,
    ) -> Batch:
        """Right-pad ragged sequences into a bucketed `Batch`.

        Each argument is one entry per sequence, 1-D over that sequence's tokens (same
        alignment as the fields). `advantages` entries may be scalars (a sequence-level
        advantage, broadcast to its policy tokens). T is padded to `next_bucket` (2^k or
        3 * 2^k, at least `min_tokens`); rows to `bucket_rows(n, row_multiple)` — use
        `Learner.row_multiple` (data-parallel size x microbatches). `bucket=False` pads only
        to multiples (T to a multiple of `min_tokens`).
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("Batch.from_sequences needs at least one sequence")
        given = {"loss_masks": loss_masks, "behaviour_logprobs": behaviour_logprobs,
                 "advantages": advantages, "rewards": rewards,
                 "proximal_logprobs": proximal_logprobs, "versions": versions}
        for name, value in given.items():
            if value is not None and len(value) != n:
                raise ValueError(f"Batch.from_sequences {name} has {len(value)} entries, "
                                 f"tokens has {n}")
        lengths = [len(t) for t in tokens]
        longest = max(max(lengths), 1)
        if bucket:
            cols = max(next_bucket(longest), min_tokens)
        else:
            cols = min_tokens * math.ceil(longest / min_tokens)
        rows = bucket_rows(n, row_multiple) if bucket else \
            row_multiple * math.ceil(n / row_multiple)

        def fill(entries, dtype, pad_value=0):
            out = np.full((rows, cols), pad_value, dtype=dtype)
            for i, (entry, length) in enumerate(zip(entries, lengths)):
                entry = np.asarray(entry, dtype=dtype)
                if entry.ndim == 0:
                    entry = np.full(length, entry, dtype=dtype)
                if entry.shape != (length,):
                    raise ValueError(f"Batch.from_sequences sequence {i}: expected shape "
                                     f"({length},) like its tokens, got {entry.shape}")
                out[i, :length] = entry
            return out

        loss_mask = fill(loss_masks, np.float32)
        attention = np.zeros((rows, cols), np.int32)
        for i, length in enumerate(lengths):
            attention[i, :length] = 1
        return cls(
            tokens_bt=fill(tokens, np.int32),
            attention_mask_bt=attention,
            loss_mask_bt=loss_mask,
            behaviour_logprobs_bt=fill(behaviour_logprobs, np.float32) * (loss_mask != 0),
            advantages_bt=fill(advantages, np.float32) * (loss_mask != 0),
            rewards_bt=None if rewards is None else fill(rewards, np.float32),
            proximal_logprobs_bt=None if proximal_logprobs is None
            else fill(proximal_logprobs, np.float32) * (loss_mask != 0),
            versions_bt=None if versions is None else fill(versions, np.int32, -1),
        )
