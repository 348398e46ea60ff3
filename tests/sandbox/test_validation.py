"""Each rule of `sandbox.validation` rejects a bad value with an error naming field, rule and value.

Run: `.venv/bin/python -m pytest tests/sandbox/test_validation.py -q`.
"""

import dataclasses

import pytest

from sandbox import api
from sandbox.validation import SpecError, SpecLimits, check_message_size, validate_env_spec

KINDS = ["calc", "code", "files"]
GOOD = api.EnvSpec(name="calc-1", kind="calc", tasks=(api.Task("t1", "What is 1+1?", {"answer": "2"}),))


def _with(**changes):
    return dataclasses.replace(GOOD, **changes)


def _budgets(**changes):
    return _with(budgets=dataclasses.replace(api.Budgets(), **changes))


CASES = [
    (_with(name=""), "EnvSpec.name: must match [a-z0-9][a-z0-9_.-]{0,63}, got ''"),
    (_with(name="Bad Name"), "EnvSpec.name: must match [a-z0-9][a-z0-9_.-]{0,63}, got 'Bad Name'"),
    (_with(kind="chess"), "EnvSpec.kind: must be one of ['calc', 'code', 'files', 'remote'], got 'chess'"),
    (_with(kind="remote"), "EnvSpec.remote_address: must be host:port when kind is 'remote', got ''"),
    (_with(kind="remote", remote_address="h:0"), "EnvSpec.remote_address: port must be between 1 and 65535, got 'h:0'"),
    (_with(remote_address="h:1"), "EnvSpec.remote_address: must be empty unless kind is 'remote', got 'h:1'"),
    (_with(args={"x": float("nan")}), "EnvSpec.args: must be plain JSON (Out of range float values are not JSON compliant), got {'x': nan}"),
    (_with(tasks=(api.Task("", "p"),)), "EnvSpec.tasks[0].task_id: must be non-empty and at most 128 characters, got ''"),
    (_with(tasks=(api.Task("t", ""),)), "EnvSpec.tasks[0].prompt: must be non-empty, got ''"),
    (_with(tasks=(api.Task("t", "p", split="test"),)), "EnvSpec.tasks[0].split: must be one of ['train', 'eval'], got 'test'"),
    (_with(tasks=(api.Task("t", "p"), api.Task("t", "q"))), "EnvSpec.tasks[1].task_id: must be unique within the env, got 't'"),
    (_with(tasks=(api.Task("t", "p" * 20000),)), "EnvSpec.tasks[0].prompt: must be at most 16384 characters, got '<20000 characters>'"),
    (_with(tools=(api.ToolSpec("1bad"),)), "EnvSpec.tools[0].name: must be an identifier of at most 64 characters, got '1bad'"),
    (_with(tools=(api.ToolSpec("a"), api.ToolSpec("a"))), "EnvSpec.tools[1].name: must be unique within the env, got 'a'"),
    (_with(tools=(api.ToolSpec("a", cost_per_call=-1.0),)), "EnvSpec.tools[0].cost_per_call: must be a finite number between 0 and 1e+09, got -1.0"),
    (_budgets(max_turns=0), "EnvSpec.budgets.max_turns: must be an integer between 1 and 64, got 0"),
    (_budgets(max_new_tokens_per_turn=10**6), "EnvSpec.budgets.max_new_tokens_per_turn: must be an integer between 1 and 8192, got 1000000"),
    (_budgets(max_total_tokens=8), "EnvSpec.budgets.max_total_tokens: must be an integer between 16 and 131072, got 8"),
    (_budgets(max_total_tokens=32, max_new_tokens_per_turn=64), "EnvSpec.budgets.max_total_tokens: must be at least max_new_tokens_per_turn (64), got 32"),
    (_budgets(max_tool_cost=float("inf")), "EnvSpec.budgets.max_tool_cost: must be a finite number between 0 and 1e+12, got inf"),
    (_budgets(tool_timeout_s=0.0), "EnvSpec.budgets.tool_timeout_s: must be a finite number between 0.001 and 600, got 0.0"),
    (_with(reward=api.RewardWeights(safety=-1.0)), "EnvSpec.reward.safety: must be a finite number between 0 and 1e+06, got -1.0"),
    (_with(reward=api.RewardWeights(outcome=float("nan"))), "EnvSpec.reward.outcome: must be a finite number between -1e+06 and 1e+06, got nan"),
    (_with(safety=api.SafetyPolicy(protected_paths=("/etc/passwd",))), "EnvSpec.safety.protected_paths[0]: must be a relative path inside the workspace, got '/etc/passwd'"),
    (_with(safety=api.SafetyPolicy(protected_paths=("a/../../x",))), "EnvSpec.safety.protected_paths[0]: must be a relative path inside the workspace, got 'a/../../x'"),
    (_with(sampling=api.SamplingOverrides(temperature=-0.5)), "EnvSpec.sampling.temperature: must be a finite number between 0 and 10, got -0.5"),
    (_with(sampling=api.SamplingOverrides(top_p=0.0)), "EnvSpec.sampling.top_p: must be a finite number between 1e-06 and 1, got 0.0"),
    (_with(sampling=api.SamplingOverrides(top_k=-3)), "EnvSpec.sampling.top_k: must be an integer between 0 and 1048576, got -3"),
    (_with(mixture_weight=0.0), "EnvSpec.mixture_weight: must be a finite number between 1e-09 and 1e+06, got 0.0"),
    (_with(eval_fraction=1.0), "EnvSpec.eval_fraction: must be in [0, 1), got 1.0"),
]


@pytest.mark.parametrize("spec,message", CASES, ids=[m.split(":")[0] + f"#{i}" for i, (_, m) in enumerate(CASES)])
def test_rule_rejects_bad_value_with_exact_error(spec, message):
    with pytest.raises(SpecError) as error:
        validate_env_spec(spec, known_kinds=KINDS)
    assert str(error.value) == message


def test_valid_spec_passes_unchanged():
    assert validate_env_spec(GOOD, known_kinds=KINDS) is GOOD
    remote = _with(kind="remote", remote_address="127.0.0.1:50051")
    assert validate_env_spec(remote, known_kinds=KINDS) is remote


def test_too_many_tasks_is_rejected():
    tasks = tuple(api.Task(f"t{i}", "p") for i in range(11))
    with pytest.raises(SpecError, match=r"^EnvSpec.tasks: at most 10 tasks, got 11$"):
        validate_env_spec(_with(tasks=tasks), known_kinds=KINDS, limits=SpecLimits(max_tasks=10))


def test_oversized_message_is_rejected_before_conversion():
    check_message_size(4 << 20)
    with pytest.raises(SpecError, match=r"^EnvSpec: serialised size must be at most 4194304 bytes, got 4194305$"):
        check_message_size((4 << 20) + 1)


def test_error_carries_field_rule_and_value():
    with pytest.raises(SpecError) as error:
        validate_env_spec(_budgets(max_turns=0), known_kinds=KINDS)
    assert (error.value.field, error.value.value) == ("EnvSpec.budgets.max_turns", 0)
    assert isinstance(error.value, ValueError)
