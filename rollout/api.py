"""What the rest of Orrery may import from rollout: trajectories, sampling settings, the roles.

These dataclasses are the Python side of `proto/orrery/v1/trajectory.proto` and
`rollout.proto`; `rollout/wire.py` is the only module that converts them to and from protobuf.

Invariants (DESIGN.md section 4):
- Token in, token out: a `Trajectory` is the prompt tokens, then each turn's exact tokens as the
  engine produced them (policy) or as the agent loop inserted them (environment). Nothing is
  re-tokenised from text.
- Every policy token carries the behaviour logprob it was sampled with and the weight version
  that produced it. Behaviour logprobs are of the temperature-scaled distribution the engine
  actually sampled from (logits / temperature, before top-p/top-k truncation), see
  `model.decoder.token_logprobs`; for greedy requests (temperature 0), of the temperature-1
  distribution, log softmax(logits).
- `token_stream` is the one function that turns a trajectory into (tokens, loss mask, behaviour
  logprobs, versions). The loss mask is 1 on policy tokens and 0 on prompt and environment tokens.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Iterator, Mapping, Protocol, Sequence

import numpy as np

from model.weights import WeightVersion
from sandbox.api import (
    EnvSpec,
    FileChange,
    InfraErrorClass,
    ProcessVerdict,
    SafetyViolation,
    Task,
    ToolCall,
    ToolResult,
)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn. Changing none of these recompiles the JAX engine."""

    temperature: float = 1.0  # 0 means greedy (deterministic)
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()  # sampling stops after emitting one of these (it is kept)
    stop_strings: tuple[str, ...] = ()  # sampling stops once the decoded turn ends with one (kept)
    seed: int = 0


class FinishReason(enum.Enum):
    STOP = "stop"  # a stop token or string
    LENGTH = "length"  # max_new_tokens or the context limit
    ABORT = "abort"


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    # Multi-turn KV reuse: requests of one session (one agent episode) run one after another;
    # when a prompt extends the previous prompt + output, an engine may keep that KV cache and
    # prefill only the new tokens. Engines without a cache ignore it. None: no session.
    session_id: str | None = None


@dataclasses.dataclass(frozen=True)
class Generation:
    """One engine output, token-exact. All per-token sequences have the same length."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    finish_reason: FinishReason


class EngineError(RuntimeError):
    """The engine itself failed (crashed, closed, timed out): an infrastructure error, never a reward."""


class Engine(Protocol):
    """A sampler serving one weight version at a time. Implementations: JaxEngine, SGLangEngine, FakeEngine.

    Behaviour logprobs: for temperature T > 0, log softmax(logits / T) of the sampled token,
    the temperature-scaled distribution before top-k / top-p truncation
    (`model.decoder.logprobs_from_logits` with the same T); for greedy (T == 0) the
    temperature-1 distribution, log softmax(logits). Engines that keep sessions also offer
    `release_session(session_id)`.
    """

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Sample every request to completion (continuous batching inside); order matches input."""

    def load_weights(self, version: WeightVersion) -> float:
        """Load, verify the digest, then switch atomically. Returns seconds spent. Versions only go up."""

    @property
    def version(self) -> int:
        """The weight version served now."""


class TurnRole(enum.Enum):
    POLICY = "policy"
    ENV = "env"


@dataclasses.dataclass(frozen=True)
class PolicyTurn:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # behaviour logprob of each token
    versions: tuple[int, ...]  # weight version of each token (a turn may span an update)
    finish_reason: FinishReason = FinishReason.STOP

    role = TurnRole.POLICY


@dataclasses.dataclass(frozen=True)
class EnvTurn:
    token_ids: tuple[int, ...]  # inserted observation tokens, loss-masked
    tool_call: ToolCall | None = None  # None when the policy turn held no (valid) call
    result: ToolResult = ToolResult()
    side_effects: tuple[FileChange, ...] = ()
    verdict: ProcessVerdict | None = None
    invalid_call: str = ""  # parse error of a malformed call, "" when the call was well formed

    role = TurnRole.ENV


Turn = PolicyTurn | EnvTurn


class Termination(enum.Enum):
    DONE = "done"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    MAX_TOOL_COST = "max_tool_cost"
    INVALID_LOOP = "invalid_loop"
    SAFETY_STOP = "safety_stop"
    INFRA_ERROR = "infra_error"
    ABORTED = "aborted"


@dataclasses.dataclass(frozen=True)
class Timings:
    generate_s: float = 0.0
    tools_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Trajectory:
    trajectory_id: str
    task_id: str
    env_name: str
    group_id: str
    attempt: int
    prompt_ids: tuple[int, ...]
    turns: tuple[Turn, ...]
    termination: Termination
    reward_components: Mapping[str, float]
    reward: float  # the training reward (weighted components)
    true_metric: float  # held-out real success; never trained on
    safety_violations: tuple[SafetyViolation, ...] = ()
    infra_error: InfraErrorClass = InfraErrorClass.NONE
    timings: Timings = Timings()
    split: str = "train"

    @property
    def policy_turns(self) -> list[PolicyTurn]:
        return [t for t in self.turns if isinstance(t, PolicyTurn)]

    @property
    def num_policy_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.policy_turns)

    def min_version(self) -> int:
        """Oldest weight version among the policy tokens (-1 when there are none)."""
        versions = [v for t in self.policy_turns for v in t.versions]
        return min(versions) if versions else -1


@dataclasses.dataclass(frozen=True)
class TokenStream:
    """A trajectory flattened for the learner; every array has length len(tokens)."""

    tokens: np.ndarray  # int32
    loss_mask: np.ndarray  # float32, 1.0 on policy tokens only
    behaviour_logprobs: np.ndarray  # float32, 0.0 where loss_mask is 0
    versions: np.ndarray  # int64, -1 where loss_mask is 0
    turn_index: np.ndarray  # int32, index of the policy turn a token belongs to, -1 elsewhere


def token_stream(trajectory: Trajectory) -> TokenStream:
    """The one place the loss mask is made: policy tokens get 1, prompt and env tokens 0.

    Used by the controller to build learner batches; the learner never sees turns or roles.
    """
    tokens = list(trajectory.prompt_ids)
    mask = [0.0] * len(tokens)
    logprobs = [0.0] * len(tokens)
    versions = [-1] * len(tokens)
    turn_index = [-1] * len(tokens)
    policy_turn = 0
    for turn in trajectory.turns:
        tokens.extend(turn.token_ids)
        if isinstance(turn, PolicyTurn):
            mask.extend([1.0] * len(turn.token_ids))
            logprobs.extend(turn.logprobs)
            versions.extend(turn.versions)
            turn_index.extend([policy_turn] * len(turn.token_ids))
            policy_turn += 1
        else:
            mask.extend([0.0] * len(turn.token_ids))
            logprobs.extend([0.0] * len(turn.token_ids))
            versions.extend([-1] * len(turn.token_ids))
            turn_index.extend([-1] * len(turn.token_ids))
    return TokenStream(
        tokens=np.asarray(tokens, np.int32),
        loss_mask=np.asarray(mask, np.float32),
        behaviour_logprobs=np.asarray(logprobs, np.float32),
        versions=np.asarray(versions, np.int64),
        turn_index=np.asarray(turn_index, np.int32),
    )


@dataclasses.dataclass(frozen=True)
class GroupRequest:
    """Roll out `group_size` samples of one task in one env on one worker (prefix cache reuse)."""

    group_id: str
    env: EnvSpec
    task: Task
    group_size: int
    sampling: SamplingParams
    attempt: int = 0


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    engine: str  # "jax", "sglang", "fake"
    version: int  # weight version served now
    healthy: bool
    active_groups: int = 0
    generated_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class WeightAck:
    worker_id: str
    version: int
    load_s: float


class Rollout(Protocol):
    """The controller's view of one rollout worker. Implementations: RolloutClient (gRPC), FakeRollout."""

    def rollout_group(self, request: GroupRequest, deadline_s: float) -> Iterator[Trajectory]:
        """Stream the group's trajectories as they finish."""

    def update_weights(self, version: WeightVersion, deadline_s: float) -> WeightAck: ...

    def info(self, deadline_s: float) -> WorkerInfo: ...

    def abort(self, group_id: str) -> None: ...
