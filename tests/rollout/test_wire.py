"""rollout.wire: every dataclass survives the trip through protobuf bytes unchanged.

Run: .venv/bin/python -m pytest tests/rollout/test_wire.py -q
"""

import pytest

from model.weights import WeightVersion
from orrery.v1 import rollout_pb2, trajectory_pb2, weights_pb2
from rollout import wire
from rollout.api import (EnvTurn, FinishReason, GroupRequest, PolicyTurn, SamplingParams,
                         Termination, Timings, Trajectory, WeightAck, WorkerInfo)
from sandbox.api import (Budgets, EnvSpec, FileChange, FileChangeKind, InfraErrorClass,
                         ProcessVerdict, SafetyViolation, Task, ToolCall, ToolResult)


def through_bytes(message):
    return type(message).FromString(message.SerializeToString())


TRAJECTORY = Trajectory(
    trajectory_id="g:0:1", task_id="t", env_name="calc", group_id="g", attempt=2,
    prompt_ids=(1, 2, 3),
    turns=(PolicyTurn((4, 5), (-0.5, -0.25), (3, 4), FinishReason.LENGTH),
           EnvTurn((6, 7), ToolCall("calculator", {"expression": "2+3"}),
                   ToolResult(output="5", cost=0.5, duration_s=0.01),
                   (FileChange("a.txt", FileChangeKind.CREATED, 3, "ab"),),
                   ProcessVerdict(0.5, "ok")),
           EnvTurn((), invalid_call="not JSON"),
           PolicyTurn((8,), (-1.0,), (4,))),
    termination=Termination.INVALID_LOOP, reward_components={"outcome": 0.0, "tool_cost": 0.5},
    reward=-0.5, true_metric=0.0, safety_violations=(SafetyViolation("network", "x"),),
    infra_error=InfraErrorClass.NONE, timings=Timings(1.0, 2.0, 3.0, 6.0), split="eval")


def test_trajectory_round_trip():
    assert wire.trajectory_from_proto(through_bytes(wire.trajectory_to_proto(TRAJECTORY))) == TRAJECTORY


def test_group_request_and_sampling_round_trip():
    request = GroupRequest("g", EnvSpec("calc", "calc", budgets=Budgets(max_turns=3)),
                           Task("t", "What is 2+3?", {"answer": 5}), 8,
                           SamplingParams(0.0, 0.9, 5, 12, (2, 4), ("</x>",), 7), attempt=1)
    message = through_bytes(wire.group_request_to_proto(request))
    assert wire.group_request_from_proto(message) == request
    bare = rollout_pb2.RolloutGroupRequest(group_id="g", env=message.env, task=message.task,
                                           group_size=1)
    assert wire.group_request_from_proto(bare).sampling == SamplingParams()


def test_weight_version_info_and_ack_round_trip():
    wv = WeightVersion(3, 30, "/tmp/v3", "orbax", "sha256:" + "a" * 64, 12.5)
    assert wire.weight_version_from_proto(through_bytes(wire.weight_version_to_proto(wv))) == wv
    info = WorkerInfo("w", "jax", 3, True, 2, 100)
    assert wire.worker_info_from_proto(through_bytes(wire.worker_info_to_proto(info))) == info
    ack = WeightAck("w", 3, 0.25)
    assert wire.weight_ack_from_proto(through_bytes(wire.weight_ack_to_proto(ack))) == ack


def test_unspecified_enums_are_rejected():
    with pytest.raises(ValueError, match="Trajectory.termination"):
        wire.trajectory_from_proto(trajectory_pb2.Trajectory(trajectory_id="x"))
    with pytest.raises(ValueError, match="WeightVersion.format"):
        wire.weight_version_from_proto(weights_pb2.WeightVersion(digest="sha256:0"))
