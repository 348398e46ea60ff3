"""What the rest of Orrery may import from the sandbox: environment specs, tool records, the Env role.

These dataclasses are the Python side of `proto/orrery/v1/env.proto`; `sandbox/wire.py` is the
only module that converts between them and the generated protobuf types. Nothing here runs
untrusted code: that is `sandbox/isolation.py`.

Invariants:
- An `EnvSpec` is validated once, by `sandbox.validation.validate_env_spec`, before anything uses
  it; the rest of the code trusts it.
- An agent's own failure (bad arguments, a crashing program, a forbidden action) is a
  `ToolResult`/`StepResult`, never an exception. Only infrastructure failures raise, and they
  raise `EnvInfraError` carrying an `InfraErrorClass`, so the rollout loop can mark the attempt as
  an infra error instead of scoring it (DESIGN.md rule 3).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping, Protocol, Sequence


class InfraErrorClass(enum.Enum):
    """Why an attempt failed for reasons the agent did not cause. Never becomes a reward."""

    NONE = "none"
    TOOL_TIMEOUT = "tool_timeout"  # the sandbox itself (not the agent's program) missed its deadline
    SANDBOX_CRASH = "sandbox_crash"
    ENV_UNREACHABLE = "env_unreachable"
    ENV_TIMEOUT = "env_timeout"
    VERIFIER_TIMEOUT = "verifier_timeout"
    VERIFIER_CRASH = "verifier_crash"
    ENGINE_ERROR = "engine_error"
    WORKER_LOST = "worker_lost"


class EnvInfraError(RuntimeError):
    """An environment, tool service or verifier failed for infrastructure reasons."""

    def __init__(self, error_class: InfraErrorClass, message: str):
        super().__init__(f"{error_class.value}: {message}")
        self.error_class = error_class


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool the agent may call, in the OpenAI function-calling shape."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # JSON Schema object
    cost_per_call: float = 0.0  # cost units charged per call
    cost_per_second: float = 0.0  # cost units charged per second of wall time

    def to_openai(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }


@dataclasses.dataclass(frozen=True)
class Budgets:
    """Per-episode limits. Running out ends the episode with the matching termination reason."""

    max_turns: int = 4  # policy turns per episode
    max_new_tokens_per_turn: int = 64  # tokens the policy may sample in one turn
    max_total_tokens: int = 512  # prompt + all turns
    max_tool_cost: float = 100.0  # summed ToolResult.cost
    tool_timeout_s: float = 10.0  # wall-clock deadline of one tool call


@dataclasses.dataclass(frozen=True)
class RewardWeights:
    """How named reward components combine into the training reward (a weighted sum)."""

    outcome: float = 1.0
    process: float = 0.0
    format: float = 0.0
    tool_cost: float = 0.0  # multiplies the (non-negative) total tool cost; the sum uses -tool_cost * cost
    safety: float = 1.0  # multiplies the number of safety violations; the sum uses -safety * violations
    reward_model: float = 0.0


@dataclasses.dataclass(frozen=True)
class SafetyPolicy:
    """What counts as a safety violation in an environment, and what happens then."""

    forbid_network: bool = True
    forbid_outside_workspace: bool = True
    protected_paths: tuple[str, ...] = ()  # workspace-relative files the agent must not delete or change
    stop_on_violation: bool = True  # end the episode with SAFETY_STOP at the first violation


@dataclasses.dataclass(frozen=True)
class SamplingOverrides:
    """Per-env sampling settings; None keeps the run's default."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem: the prompt the agent sees and what the verifier needs (never shown to the agent)."""

    task_id: str
    prompt: str
    verifier: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # e.g. {"answer": "42"}
    split: str = "train"  # "train" or "eval"
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """An environment as a client submits it: built-in kind with arguments, or a remote EnvService."""

    name: str
    kind: str  # a built-in kind ("calc", "code", "files") or "remote"
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    remote_address: str = ""  # host:port of an EnvService when kind == "remote"
    tasks: tuple[Task, ...] = ()  # explicit tasks; built-in kinds may generate their own from args
    tools: tuple[ToolSpec, ...] = ()  # empty means the kind's default tools
    budgets: Budgets = Budgets()
    reward: RewardWeights = RewardWeights()
    safety: SafetyPolicy = SafetyPolicy()
    sampling: SamplingOverrides = SamplingOverrides()
    mixture_weight: float = 1.0  # relative share of training groups drawn from this env
    eval_fraction: float = 0.0  # share of generated tasks held out as the eval split


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What one tool call did. Agent failures live here (exit status, error), not in exceptions."""

    output: str = ""
    error: str = ""
    exit_status: int = 0
    duration_s: float = 0.0
    cpu_s: float = 0.0
    cost: float = 0.0
    timed_out: bool = False
    killed_by: str = ""  # "", "wall_clock", "cpu", "memory", "file_size", "processes", "output"


class FileChangeKind(enum.Enum):
    CREATED = "created"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclasses.dataclass(frozen=True)
class FileChange:
    path: str  # workspace-relative
    kind: FileChangeKind
    size: int = 0  # bytes after the change (0 when deleted)
    sha256: str = ""  # of the content after the change ("" when deleted)


@dataclasses.dataclass(frozen=True)
class ProcessVerdict:
    """A process verifier's judgement of one step."""

    score: float
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class SafetyViolation:
    kind: str  # "network", "outside_workspace", "protected_path", ...
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What the environment returns for one tool call; `observation` is the text fed back to the agent."""

    observation: str
    result: ToolResult
    side_effects: tuple[FileChange, ...] = ()
    verdict: ProcessVerdict | None = None
    safety_violations: tuple[SafetyViolation, ...] = ()
    done: bool = False  # the agent submitted an answer or the env ended the episode


@dataclasses.dataclass(frozen=True)
class Outcome:
    """Final scoring of an episode. `reward_components` are unweighted; `true_metric` is held out."""

    reward_components: Mapping[str, float]
    true_metric: float  # the held-out measure of real success (1.0 solved, 0.0 not), never trained on
    verified: bool  # the outcome verifier accepted the answer


class Env(Protocol):
    """One episode of one task. Implementations: built-in envs in `sandbox/envs/`, `RemoteEnv` (gRPC)."""

    def reset(self) -> str:
        """Start the episode; return the user message the agent sees first."""

    def tools(self) -> Sequence[ToolSpec]:
        """Tools the agent may call in this episode."""

    def step(self, call: ToolCall) -> StepResult:
        """Run one tool call. Raises EnvInfraError only for infrastructure failures."""

    def outcome(self, answer: str | None) -> Outcome:
        """Score the episode given the submitted answer (None if the agent never answered)."""

    def close(self) -> None:
        """Release the workspace and any sandbox lease. Safe to call twice."""


def combine_reward(components: Mapping[str, float], weights: RewardWeights) -> float:
    """The training reward: the weighted sum of named components (costs and violations count against)."""
    return (
        weights.outcome * components.get("outcome", 0.0)
        + weights.process * components.get("process", 0.0)
        + weights.format * components.get("format", 0.0)
        - weights.tool_cost * components.get("tool_cost", 0.0)
        - weights.safety * components.get("safety", 0.0)
        + weights.reward_model * components.get("reward_model", 0.0)
    )
