"""Conversion between rollout's dataclasses (`rollout/api.py`) and protobuf (`orrery.v1`).

One of the three modules of `rollout/` that touch generated code (with `service.py` and
`client.py`). Env specs, tasks and tool records go through `sandbox.wire`; this module covers
sampling settings, group requests, trajectories, weight versions, worker info and acks.

Every pair round-trips: `from_proto(to_proto(x)) == x` for valid values. Proto3 zero defaults
that would be invalid in the dataclass read as the dataclass default: SamplingParams.top_p 0 ->
1.0, max_new_tokens 0 -> 64; an absent SamplingParams message -> SamplingParams(). Per-token
logprobs travel as float32 (proto `repeated float`), so a round trip rounds them to float32.
"""

from __future__ import annotations

import numpy as np

from model.weights import WeightVersion
from orrery.v1 import rollout_pb2, trajectory_pb2, weights_pb2
from rollout import api
from sandbox import wire as sandbox_wire

# ---------------------------------------------------------------------------- sampling


def sampling_to_proto(s: api.SamplingParams) -> rollout_pb2.SamplingParams:
    return rollout_pb2.SamplingParams(
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
        max_new_tokens=s.max_new_tokens, stop_token_ids=list(s.stop_token_ids),
        stop_strings=list(s.stop_strings), seed=s.seed)


def sampling_from_proto(m: rollout_pb2.SamplingParams) -> api.SamplingParams:
    defaults = api.SamplingParams()
    return api.SamplingParams(
        temperature=m.temperature, top_p=m.top_p or defaults.top_p, top_k=m.top_k,
        max_new_tokens=m.max_new_tokens or defaults.max_new_tokens,
        stop_token_ids=tuple(m.stop_token_ids), stop_strings=tuple(m.stop_strings), seed=m.seed)


def group_request_to_proto(r: api.GroupRequest) -> rollout_pb2.RolloutGroupRequest:
    return rollout_pb2.RolloutGroupRequest(
        group_id=r.group_id, env=sandbox_wire.env_spec_to_proto(r.env),
        task=sandbox_wire.task_to_proto(r.task), group_size=r.group_size,
        sampling=sampling_to_proto(r.sampling), attempt=r.attempt)


def group_request_from_proto(m: rollout_pb2.RolloutGroupRequest) -> api.GroupRequest:
    sampling = sampling_from_proto(m.sampling) if m.HasField("sampling") else api.SamplingParams()
    return api.GroupRequest(
        group_id=m.group_id, env=sandbox_wire.env_spec_from_proto(m.env),
        task=sandbox_wire.task_from_proto(m.task), group_size=m.group_size, sampling=sampling,
        attempt=m.attempt)


# ---------------------------------------------------------------------------- trajectories

_FINISH_TO_PROTO = {r: trajectory_pb2.FinishReason.Value(f"FINISH_REASON_{r.name}")
                    for r in api.FinishReason}
_FINISH_FROM_PROTO = {v: k for k, v in _FINISH_TO_PROTO.items()}
_TERMINATION_TO_PROTO = {t: trajectory_pb2.Termination.Value(f"TERMINATION_{t.name}")
                         for t in api.Termination}
_TERMINATION_FROM_PROTO = {v: k for k, v in _TERMINATION_TO_PROTO.items()}


def _enum_from_proto(table: dict, value: int, what: str):
    if value not in table:
        raise ValueError(f"{what} must be one of {sorted(table)} (UNSPECIFIED is not allowed), "
                         f"got {value}")
    return table[value]


def _floats(values) -> tuple[float, ...]:
    return tuple(float(x) for x in np.asarray(values, np.float32))


def turn_to_proto(turn: api.Turn) -> trajectory_pb2.Turn:
    if isinstance(turn, api.PolicyTurn):
        return trajectory_pb2.Turn(policy=trajectory_pb2.PolicyTurn(
            token_ids=list(turn.token_ids), logprobs=list(turn.logprobs),
            versions=list(turn.versions), finish_reason=_FINISH_TO_PROTO[turn.finish_reason]))
    env = trajectory_pb2.EnvTurn(
        token_ids=list(turn.token_ids), result=sandbox_wire.tool_result_to_proto(turn.result),
        side_effects=[sandbox_wire.file_change_to_proto(c) for c in turn.side_effects],
        invalid_call=turn.invalid_call)
    if turn.tool_call is not None:
        env.tool_call.CopyFrom(sandbox_wire.tool_call_to_proto(turn.tool_call))
    if turn.verdict is not None:
        env.verdict.CopyFrom(sandbox_wire.verdict_to_proto(turn.verdict))
    return trajectory_pb2.Turn(env=env)


def turn_from_proto(m: trajectory_pb2.Turn) -> api.Turn:
    kind = m.WhichOneof("turn")
    if kind == "policy":
        p = m.policy
        return api.PolicyTurn(
            token_ids=tuple(p.token_ids), logprobs=_floats(p.logprobs), versions=tuple(p.versions),
            finish_reason=_enum_from_proto(_FINISH_FROM_PROTO, p.finish_reason,
                                           "PolicyTurn.finish_reason"))
    if kind == "env":
        e = m.env
        return api.EnvTurn(
            token_ids=tuple(e.token_ids),
            tool_call=sandbox_wire.tool_call_from_proto(e.tool_call) if e.HasField("tool_call")
            else None,
            result=sandbox_wire.tool_result_from_proto(e.result),
            side_effects=tuple(sandbox_wire.file_change_from_proto(c) for c in e.side_effects),
            verdict=sandbox_wire.verdict_from_proto(e), invalid_call=e.invalid_call)
    raise ValueError("Turn must hold a policy or an env turn, got neither")


def trajectory_to_proto(t: api.Trajectory) -> trajectory_pb2.Trajectory:
    return trajectory_pb2.Trajectory(
        trajectory_id=t.trajectory_id, task_id=t.task_id, env_name=t.env_name,
        group_id=t.group_id, attempt=t.attempt, prompt_ids=list(t.prompt_ids),
        turns=[turn_to_proto(turn) for turn in t.turns],
        termination=_TERMINATION_TO_PROTO[t.termination],
        reward_components=dict(t.reward_components), reward=t.reward, true_metric=t.true_metric,
        safety_violations=[sandbox_wire.violation_to_proto(v) for v in t.safety_violations],
        infra_error=sandbox_wire.infra_error_to_proto(t.infra_error),
        timings=trajectory_pb2.Timings(generate_s=t.timings.generate_s,
                                       tools_s=t.timings.tools_s, verify_s=t.timings.verify_s,
                                       total_s=t.timings.total_s),
        split=t.split)


def trajectory_from_proto(m: trajectory_pb2.Trajectory) -> api.Trajectory:
    return api.Trajectory(
        trajectory_id=m.trajectory_id, task_id=m.task_id, env_name=m.env_name,
        group_id=m.group_id, attempt=m.attempt, prompt_ids=tuple(m.prompt_ids),
        turns=tuple(turn_from_proto(turn) for turn in m.turns),
        termination=_enum_from_proto(_TERMINATION_FROM_PROTO, m.termination,
                                     "Trajectory.termination"),
        reward_components=dict(m.reward_components), reward=m.reward, true_metric=m.true_metric,
        safety_violations=tuple(sandbox_wire.violation_from_proto(v)
                                for v in m.safety_violations),
        infra_error=sandbox_wire.infra_error_from_proto(m.infra_error),
        timings=api.Timings(generate_s=m.timings.generate_s, tools_s=m.timings.tools_s,
                            verify_s=m.timings.verify_s, total_s=m.timings.total_s),
        split=m.split or "train")


# ---------------------------------------------------------------------------- weights, info

_FORMAT_TO_PROTO = {"orbax": weights_pb2.WEIGHT_FORMAT_ORBAX,
                    "hf_safetensors": weights_pb2.WEIGHT_FORMAT_HF_SAFETENSORS}
_FORMAT_FROM_PROTO = {v: k for k, v in _FORMAT_TO_PROTO.items()}


def weight_version_to_proto(v: WeightVersion) -> weights_pb2.WeightVersion:
    return weights_pb2.WeightVersion(
        version=v.version, learner_step=v.step, location=v.location,
        format=_FORMAT_TO_PROTO[v.format], digest=v.digest, created_unix_s=v.created_at)


def weight_version_from_proto(m: weights_pb2.WeightVersion) -> WeightVersion:
    return WeightVersion(
        version=m.version, step=m.learner_step, location=m.location,
        format=_enum_from_proto(_FORMAT_FROM_PROTO, m.format, "WeightVersion.format"),
        digest=m.digest, created_at=m.created_unix_s)


def worker_info_to_proto(i: api.WorkerInfo) -> rollout_pb2.GetInfoResponse:
    return rollout_pb2.GetInfoResponse(
        worker_id=i.worker_id, engine=i.engine, version=i.version, healthy=i.healthy,
        active_groups=i.active_groups, generated_tokens=i.generated_tokens)


def worker_info_from_proto(m: rollout_pb2.GetInfoResponse) -> api.WorkerInfo:
    return api.WorkerInfo(worker_id=m.worker_id, engine=m.engine, version=m.version,
                          healthy=m.healthy, active_groups=m.active_groups,
                          generated_tokens=m.generated_tokens)


def weight_ack_to_proto(a: api.WeightAck) -> rollout_pb2.UpdateWeightsResponse:
    return rollout_pb2.UpdateWeightsResponse(worker_id=a.worker_id, version=a.version,
                                             load_s=a.load_s)


def weight_ack_from_proto(m: rollout_pb2.UpdateWeightsResponse) -> api.WeightAck:
    return api.WeightAck(worker_id=m.worker_id, version=m.version, load_s=m.load_s)
