"""Conversion between the sandbox's dataclasses (`sandbox/api.py`) and protobuf (`orrery.v1`).

The only module of `sandbox/` besides `service.py` and `client.py` that touches generated code.
Every `to_proto`/`from_proto` pair round-trips exactly: `x == from_proto(to_proto(x))`.
JSON-like fields (`args`, `verifier`, `metadata`, tool `parameters`) travel as
`google.protobuf.Struct`, so numbers come back as floats unless they are whole (then ints).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from google.protobuf import json_format, struct_pb2

from orrery.v1 import env_pb2, env_service_pb2, trajectory_pb2
from sandbox import api


def _struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(_jsonable(value))
    return message


def _jsonable(value: Any) -> Any:
    """Plain JSON types only: tuples become lists, mappings become dicts."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _unstruct(message: struct_pb2.Struct) -> dict[str, Any]:
    return _ints(json_format.MessageToDict(message))


def _ints(value: Any) -> Any:
    """Struct stores every number as a double; give whole numbers back as ints."""
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def tool_spec_to_proto(spec: api.ToolSpec) -> env_pb2.ToolSpec:
    return env_pb2.ToolSpec(
        name=spec.name,
        description=spec.description,
        parameters=_struct(spec.parameters),
        cost_per_call=spec.cost_per_call,
        cost_per_second=spec.cost_per_second,
    )


def tool_spec_from_proto(message: env_pb2.ToolSpec) -> api.ToolSpec:
    return api.ToolSpec(
        name=message.name,
        description=message.description,
        parameters=_unstruct(message.parameters),
        cost_per_call=message.cost_per_call,
        cost_per_second=message.cost_per_second,
    )


def task_to_proto(task: api.Task) -> env_pb2.Task:
    return env_pb2.Task(
        task_id=task.task_id,
        prompt=task.prompt,
        verifier=_struct(task.verifier),
        split=task.split,
        metadata=_struct(task.metadata),
    )


def task_from_proto(message: env_pb2.Task) -> api.Task:
    return api.Task(
        task_id=message.task_id,
        prompt=message.prompt,
        verifier=_unstruct(message.verifier),
        split=message.split or "train",
        metadata=_unstruct(message.metadata),
    )


def _budgets_to_proto(b: api.Budgets) -> env_pb2.Budgets:
    return env_pb2.Budgets(
        max_turns=b.max_turns,
        max_new_tokens_per_turn=b.max_new_tokens_per_turn,
        max_total_tokens=b.max_total_tokens,
        max_tool_cost=b.max_tool_cost,
        tool_timeout_s=b.tool_timeout_s,
    )


def _reward_to_proto(r: api.RewardWeights) -> env_pb2.RewardWeights:
    return env_pb2.RewardWeights(
        outcome=r.outcome, process=r.process, format=r.format,
        tool_cost=r.tool_cost, safety=r.safety, reward_model=r.reward_model,
    )


def safety_to_proto(s: api.SafetyPolicy) -> env_pb2.SafetyPolicy:
    return env_pb2.SafetyPolicy(
        forbid_network=s.forbid_network,
        forbid_outside_workspace=s.forbid_outside_workspace,
        protected_paths=list(s.protected_paths),
        stop_on_violation=s.stop_on_violation,
    )


def safety_from_proto(m: env_pb2.SafetyPolicy) -> api.SafetyPolicy:
    return api.SafetyPolicy(
        forbid_network=m.forbid_network,
        forbid_outside_workspace=m.forbid_outside_workspace,
        protected_paths=tuple(m.protected_paths),
        stop_on_violation=m.stop_on_violation,
    )


def _sampling_to_proto(s: api.SamplingOverrides) -> env_pb2.SamplingOverrides:
    message = env_pb2.SamplingOverrides()
    if s.temperature is not None:
        message.temperature = s.temperature
    if s.top_p is not None:
        message.top_p = s.top_p
    if s.top_k is not None:
        message.top_k = s.top_k
    return message


def _sampling_from_proto(m: env_pb2.SamplingOverrides) -> api.SamplingOverrides:
    return api.SamplingOverrides(
        temperature=m.temperature if m.HasField("temperature") else None,
        top_p=m.top_p if m.HasField("top_p") else None,
        top_k=m.top_k if m.HasField("top_k") else None,
    )


def env_spec_to_proto(spec: api.EnvSpec) -> env_pb2.EnvSpec:
    return env_pb2.EnvSpec(
        name=spec.name,
        kind=spec.kind,
        args=_struct(spec.args),
        remote_address=spec.remote_address,
        tasks=[task_to_proto(t) for t in spec.tasks],
        tools=[tool_spec_to_proto(t) for t in spec.tools],
        budgets=_budgets_to_proto(spec.budgets),
        reward=_reward_to_proto(spec.reward),
        safety=safety_to_proto(spec.safety),
        sampling=_sampling_to_proto(spec.sampling),
        mixture_weight=spec.mixture_weight,
        eval_fraction=spec.eval_fraction,
    )


def env_spec_from_proto(message: env_pb2.EnvSpec) -> api.EnvSpec:
    """Convert a client's message. Unset sub-messages take the dataclass defaults.

    Structure only: call `sandbox.validation.validate_env_spec` on the result before use.
    """
    defaults = api.EnvSpec(name="", kind="")
    return api.EnvSpec(
        name=message.name,
        kind=message.kind,
        args=_unstruct(message.args),
        remote_address=message.remote_address,
        tasks=tuple(task_from_proto(t) for t in message.tasks),
        tools=tuple(tool_spec_from_proto(t) for t in message.tools),
        budgets=api.Budgets(**{f: getattr(message.budgets, f) for f in _fields(api.Budgets)})
        if message.HasField("budgets") else defaults.budgets,
        reward=api.RewardWeights(**{f: getattr(message.reward, f) for f in _fields(api.RewardWeights)})
        if message.HasField("reward") else defaults.reward,
        safety=safety_from_proto(message.safety) if message.HasField("safety") else defaults.safety,
        sampling=_sampling_from_proto(message.sampling),
        mixture_weight=message.mixture_weight if message.mixture_weight else defaults.mixture_weight,
        eval_fraction=message.eval_fraction,
    )


def _fields(cls) -> list[str]:
    return [f for f in cls.__dataclass_fields__]


def tool_call_to_proto(call: api.ToolCall) -> trajectory_pb2.ToolCall:
    return trajectory_pb2.ToolCall(name=call.name, arguments_json=json.dumps(_jsonable(call.arguments), sort_keys=True))


def tool_call_from_proto(message: trajectory_pb2.ToolCall) -> api.ToolCall:
    arguments = json.loads(message.arguments_json) if message.arguments_json else {}
    return api.ToolCall(name=message.name, arguments=arguments)


def tool_result_to_proto(r: api.ToolResult) -> trajectory_pb2.ToolResult:
    return trajectory_pb2.ToolResult(
        output=r.output, error=r.error, exit_status=r.exit_status, duration_s=r.duration_s,
        cpu_s=r.cpu_s, cost=r.cost, timed_out=r.timed_out, killed_by=r.killed_by,
    )


def tool_result_from_proto(m: trajectory_pb2.ToolResult) -> api.ToolResult:
    return api.ToolResult(
        output=m.output, error=m.error, exit_status=m.exit_status, duration_s=m.duration_s,
        cpu_s=m.cpu_s, cost=m.cost, timed_out=m.timed_out, killed_by=m.killed_by,
    )


_CHANGE_KIND_TO_PROTO = {
    api.FileChangeKind.CREATED: trajectory_pb2.FILE_CHANGE_KIND_CREATED,
    api.FileChangeKind.MODIFIED: trajectory_pb2.FILE_CHANGE_KIND_MODIFIED,
    api.FileChangeKind.DELETED: trajectory_pb2.FILE_CHANGE_KIND_DELETED,
}
_CHANGE_KIND_FROM_PROTO = {v: k for k, v in _CHANGE_KIND_TO_PROTO.items()}


def file_change_to_proto(c: api.FileChange) -> trajectory_pb2.FileChange:
    return trajectory_pb2.FileChange(path=c.path, kind=_CHANGE_KIND_TO_PROTO[c.kind], size=c.size, sha256=c.sha256)


def file_change_from_proto(m: trajectory_pb2.FileChange) -> api.FileChange:
    if m.kind not in _CHANGE_KIND_FROM_PROTO:
        raise ValueError(f"FileChange.kind: must be CREATED, MODIFIED or DELETED, got {m.kind}")
    return api.FileChange(path=m.path, kind=_CHANGE_KIND_FROM_PROTO[m.kind], size=m.size, sha256=m.sha256)


def verdict_to_proto(v: api.ProcessVerdict | None) -> trajectory_pb2.ProcessVerdict | None:
    return None if v is None else trajectory_pb2.ProcessVerdict(score=v.score, reason=v.reason)


def verdict_from_proto(parent, field: str = "verdict") -> api.ProcessVerdict | None:
    """The verdict of `parent.<field>`, or None when the field is unset."""
    if not parent.HasField(field):
        return None
    m = getattr(parent, field)
    return api.ProcessVerdict(score=m.score, reason=m.reason)


def violation_to_proto(v: api.SafetyViolation) -> trajectory_pb2.SafetyViolation:
    return trajectory_pb2.SafetyViolation(kind=v.kind, detail=v.detail)


def violation_from_proto(m: trajectory_pb2.SafetyViolation) -> api.SafetyViolation:
    return api.SafetyViolation(kind=m.kind, detail=m.detail)


_INFRA_TO_PROTO = {c: trajectory_pb2.InfraErrorClass.Value(f"INFRA_ERROR_CLASS_{c.name}") for c in api.InfraErrorClass}
_INFRA_FROM_PROTO = {v: k for k, v in _INFRA_TO_PROTO.items()}


def infra_error_to_proto(c: api.InfraErrorClass) -> int:
    return _INFRA_TO_PROTO[c]


def infra_error_from_proto(value: int) -> api.InfraErrorClass:
    if value == trajectory_pb2.INFRA_ERROR_CLASS_UNSPECIFIED:
        return api.InfraErrorClass.NONE
    if value not in _INFRA_FROM_PROTO:
        raise ValueError(f"infra_error: unknown InfraErrorClass value {value}")
    return _INFRA_FROM_PROTO[value]


# --- EnvService replies (used by sandbox/service.py and sandbox/client.py) -------------------


def args_to_proto(args: Mapping[str, Any]) -> struct_pb2.Struct:
    """Env arguments (plain JSON) as a Struct."""
    return _struct(args)


def args_from_proto(message: struct_pb2.Struct) -> dict[str, Any]:
    return _unstruct(message)


def step_result_to_proto(step: api.StepResult) -> env_service_pb2.StepResponse:
    response = env_service_pb2.StepResponse(
        observation=step.observation,
        result=tool_result_to_proto(step.result),
        side_effects=[file_change_to_proto(c) for c in step.side_effects],
        safety_violations=[violation_to_proto(v) for v in step.safety_violations],
        done=step.done,
    )
    if step.verdict is not None:
        response.verdict.CopyFrom(verdict_to_proto(step.verdict))
    return response


def step_result_from_proto(m: env_service_pb2.StepResponse) -> api.StepResult:
    return api.StepResult(
        observation=m.observation,
        result=tool_result_from_proto(m.result),
        side_effects=tuple(file_change_from_proto(c) for c in m.side_effects),
        verdict=verdict_from_proto(m),
        safety_violations=tuple(violation_from_proto(v) for v in m.safety_violations),
        done=m.done,
    )


def outcome_to_proto(outcome: api.Outcome) -> env_service_pb2.ScoreResponse:
    return env_service_pb2.ScoreResponse(reward_components=dict(outcome.reward_components),
                                         true_metric=outcome.true_metric, verified=outcome.verified)


def outcome_from_proto(m: env_service_pb2.ScoreResponse) -> api.Outcome:
    return api.Outcome(reward_components=dict(m.reward_components), true_metric=m.true_metric, verified=m.verified)


def env_spec_to_json(spec: api.EnvSpec) -> dict[str, Any]:
    """The spec as plain JSON data (the protobuf JSON mapping), e.g. for checkpoint state."""
    return json_format.MessageToDict(env_spec_to_proto(spec), preserving_proto_field_name=True)


def env_spec_from_json(data: Mapping[str, Any]) -> api.EnvSpec:
    """Inverse of `env_spec_to_json`; unknown fields are an error naming them."""
    return env_spec_from_proto(json_format.ParseDict(dict(data), env_pb2.EnvSpec()))
