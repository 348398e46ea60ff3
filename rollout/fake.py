"""Deterministic fakes of rollout's roles, for tests of the other side (controller, agent loop).

- `FakeEngine` (implements `rollout.api.Engine`): no model. Each request's tokens come from a
  `script(request) -> token ids` (default: a hash of the prompt and seed), cut at the first stop
  id or max_new_tokens; every logprob is -1.0 and every version the one served. It records every
  request and generation in order, so tests can compare trajectories with its raw outputs.
  `load_weights` enforces "versions only go up" without reading files.
- `FakeRollout` (implements `rollout.api.Rollout`): trajectories without an engine or env. Sample
  i of a group gets reward `reward_fn(request, i)` (default: 1.0 for even i, else 0.0), one
  policy turn of `tokens_per_sample` tokens stamped with the version served, and DONE.

What they are not: models of timing or failure. Use the real engine (tests/rollout) for that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from typing import Callable, Iterator, Sequence

from model.weights import WeightVersion
from rollout.api import (
    FinishReason,
    Generation,
    GenerationRequest,
    GroupRequest,
    PolicyTurn,
    Termination,
    Trajectory,
    WeightAck,
    WorkerInfo,
)

Script = Callable[[GenerationRequest], Sequence[int]]


def hashed_tokens(request: GenerationRequest, vocab_size: int = 256) -> list[int]:
    """max_new_tokens ids in [7, vocab_size) from a hash of (prompt, seed); deterministic."""
    digest = hashlib.sha256(repr((request.prompt_ids, request.sampling.seed)).encode()).digest()
    out = []
    while len(out) < request.sampling.max_new_tokens:
        out.extend(7 + b % (vocab_size - 7) for b in digest)
        digest = hashlib.sha256(digest).digest()
    return out[:request.sampling.max_new_tokens]


class FakeEngine:
    """A scripted engine; see the module docstring."""

    name = "fake"

    def __init__(self, script: Script = hashed_tokens, version: int = 0):
        self.script = script
        self._version = version
        self._lock = threading.Lock()
        self.requests: list[GenerationRequest] = []
        self.generations: list[Generation] = []
        self.released: list[str] = []
        self.healthy = True
        self.stats: dict[str, int] = {"generated_tokens": 0}

    @property
    def version(self) -> int:
        return self._version

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [self._one(r) for r in requests]

    def _one(self, request: GenerationRequest) -> Generation:
        tokens: list[int] = []
        reason = FinishReason.LENGTH
        for token in list(self.script(request))[:request.sampling.max_new_tokens]:
            tokens.append(int(token))
            if token in request.sampling.stop_token_ids:
                reason = FinishReason.STOP
                break
        if len(tokens) < request.sampling.max_new_tokens and reason is FinishReason.LENGTH:
            reason = FinishReason.STOP  # the script ended the turn itself
        gen = Generation(request.request_id, tuple(tokens), (-1.0,) * len(tokens),
                         (self._version,) * len(tokens), reason)
        with self._lock:
            self.requests.append(request)
            self.generations.append(gen)
            self.stats["generated_tokens"] += len(tokens)
        return gen

    def load_weights(self, version: WeightVersion) -> float:
        if version.version < self._version:
            raise ValueError(f"FakeEngine.load_weights version must not go down: serving "
                             f"{self._version}, got {version.version}")
        self._version = version.version
        return 0.0

    def release_session(self, session_id: str) -> None:
        with self._lock:
            self.released.append(session_id)


def _alternating(request: GroupRequest, index: int) -> float:
    return 1.0 if index % 2 == 0 else 0.0


@dataclasses.dataclass
class FakeRollout:
    """A worker without engine or env; see the module docstring."""

    worker_id: str = "fake-0"
    version: int = 0
    tokens_per_sample: int = 4
    reward_fn: Callable[[GroupRequest, int], float] = _alternating
    aborted: list[str] = dataclasses.field(default_factory=list)
    groups: list[GroupRequest] = dataclasses.field(default_factory=list)

    def rollout_group(self, request: GroupRequest, deadline_s: float) -> Iterator[Trajectory]:
        self.groups.append(request)
        prompt = tuple(7 + b % 200 for b in request.task.prompt.encode()[:16]) or (7,)
        for index in range(request.group_size):
            reward = float(self.reward_fn(request, index))
            n = self.tokens_per_sample
            turn = PolicyTurn(tuple(range(10, 10 + n)), (-1.0,) * n, (self.version,) * n)
            yield Trajectory(
                trajectory_id=f"{request.group_id}:{request.attempt}:{index}",
                task_id=request.task.task_id, env_name=request.env.name,
                group_id=request.group_id, attempt=request.attempt, prompt_ids=prompt,
                turns=(turn,), termination=Termination.DONE,
                reward_components={"outcome": reward}, reward=reward, true_metric=reward,
                split=request.task.split)

    def update_weights(self, version: WeightVersion, deadline_s: float) -> WeightAck:
        if version.version < self.version:
            raise ValueError(f"FakeRollout.update_weights version must not go down: serving "
                             f"{self.version}, got {version.version}")
        self.version = version.version
        return WeightAck(self.worker_id, self.version, 0.0)

    def info(self, deadline_s: float) -> WorkerInfo:
        return WorkerInfo(self.worker_id, "fake", self.version, True)

    def abort(self, group_id: str) -> None:
        self.aborted.append(group_id)
