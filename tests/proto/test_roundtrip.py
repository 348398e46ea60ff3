"""Every message survives serialise/parse, and the env converters round-trip exactly.

Run: `.venv/bin/python -m pytest tests/proto -q`.
"""

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.message import Message

from orrery.v1 import controller_pb2, env_pb2, env_service_pb2, rollout_pb2, trajectory_pb2, weights_pb2
from sandbox import api, wire

MODULES = [controller_pb2, env_pb2, env_service_pb2, rollout_pb2, trajectory_pb2, weights_pb2]


def _all_message_classes():
    for module in MODULES:
        for name in module.DESCRIPTOR.message_types_by_name:
            yield getattr(module, name)


def _fill(message: Message, depth: int = 0) -> Message:
    """Set every field to a non-default value (recursing into messages up to depth 3)."""
    for field in message.DESCRIPTOR.fields:
        if field.containing_oneof is not None and field.containing_oneof.fields[0] is not field:
            continue  # one member per oneof
        value = _value(field, message, depth)
        if value is None:
            continue
        if field.is_repeated:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                getattr(message, field.name)["k"] = value if not isinstance(value, Message) else None
            elif field.message_type is not None:
                _fill(getattr(message, field.name).add(), depth + 1)
            else:
                getattr(message, field.name).extend([value, value])
        elif field.message_type is not None and field.message_type.full_name == "google.protobuf.Struct":
            getattr(message, field.name).update({"k": [1, "v", {"n": None}]})
        elif field.message_type is not None:
            _fill(getattr(message, field.name), depth + 1)
        else:
            setattr(message, field.name, value)
    return message


def _value(field, message, depth):
    t = field.type
    fd = descriptor_pb2.FieldDescriptorProto
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            return _value(value_field, message, depth)
        if field.message_type.full_name == "google.protobuf.Struct":
            return True
        if depth >= 3:
            return None
        return True
    if t in (fd.TYPE_STRING,):
        return "s"
    if t in (fd.TYPE_BOOL,):
        return True
    if t in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        return 1.5
    if t == fd.TYPE_ENUM:
        return field.enum_type.values[-1].number
    return 7


@pytest.mark.parametrize("cls", list(_all_message_classes()), ids=lambda c: c.DESCRIPTOR.full_name)
def test_message_survives_serialise_and_parse(cls):
    original = _fill(cls())
    parsed = cls.FromString(original.SerializeToString())
    assert parsed == original
    if original.DESCRIPTOR.fields:
        assert original.ByteSize() > 0


def test_env_spec_round_trips_through_proto():
    spec = api.EnvSpec(
        name="calc-hard",
        kind="calc",
        args={"level": 3, "num_tasks": 100, "ops": ["+", "*"], "nested": {"x": 0.25}},
        tasks=(
            api.Task("t1", "What is 2+2?", {"answer": "4"}, split="train", metadata={"source": "hand"}),
            api.Task("t2", "What is 3*3?", {"answer": "9"}, split="eval"),
        ),
        tools=(api.ToolSpec("calculator", "arithmetic", {"type": "object", "properties": {}}, 0.1, 0.01),),
        budgets=api.Budgets(max_turns=3, max_new_tokens_per_turn=32, max_total_tokens=256, max_tool_cost=5.0),
        reward=api.RewardWeights(outcome=1.0, process=0.5, format=0.1, tool_cost=0.01, safety=2.0),
        safety=api.SafetyPolicy(protected_paths=("data/keep.txt",), stop_on_violation=False),
        sampling=api.SamplingOverrides(temperature=0.7, top_k=20),
        mixture_weight=2.0,
        eval_fraction=0.1,
    )
    message = env_pb2.EnvSpec.FromString(wire.env_spec_to_proto(spec).SerializeToString())
    assert wire.env_spec_from_proto(message) == spec


def test_unset_submessages_take_defaults():
    spec = wire.env_spec_from_proto(env_pb2.EnvSpec(name="x", kind="calc"))
    assert spec.budgets == api.Budgets()
    assert spec.reward == api.RewardWeights()
    assert spec.safety == api.SafetyPolicy()
    assert spec.mixture_weight == 1.0


def test_tool_records_round_trip():
    call = api.ToolCall("calculator", {"expression": "2*(3+4)"})
    assert wire.tool_call_from_proto(wire.tool_call_to_proto(call)) == call
    result = api.ToolResult("14", "", 0, 0.01, 0.005, 0.1, False, "")
    assert wire.tool_result_from_proto(wire.tool_result_to_proto(result)) == result
    change = api.FileChange("out/a.txt", api.FileChangeKind.MODIFIED, 12, "ab" * 32)
    assert wire.file_change_from_proto(wire.file_change_to_proto(change)) == change
    for c in api.InfraErrorClass:
        assert wire.infra_error_from_proto(wire.infra_error_to_proto(c)) is c
