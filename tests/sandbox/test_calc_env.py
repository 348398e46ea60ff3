"""The `calc` demo env: deterministic tasks, disjoint splits, scoring, and no sandbox anywhere.

Proves: tasks are a pure function of (level, num_tasks, seed) and match each level's shape; the
eval split has the requested size and shares no problem with train; the calculator step returns
just the value; outcome/format/process/true_metric follow the rules in sandbox/envs/calc.py; the env never
builds a sandbox pool (the demo must stay microseconds per tool call).

Run: .venv/bin/python -m pytest tests/sandbox/test_calc_env.py -q
"""

from __future__ import annotations

import re

import pytest

import sandbox.pool
from sandbox.api import Budgets, EnvSpec, RewardWeights, ToolCall, combine_reward
from sandbox.envs import KINDS, generate_tasks, make_env
from sandbox.envs.calc import expression_credit, parse_integer


def spec(level=1, num_tasks=50, seed=0, eval_fraction=0.0, **kw) -> EnvSpec:
    return EnvSpec("calc", "calc", {"level": level, "num_tasks": num_tasks, "seed": seed},
                   eval_fraction=eval_fraction, **kw)


@pytest.fixture(autouse=True)
def no_pool(monkeypatch):
    def refuse(config):
        raise AssertionError("calc must not build a sandbox pool")
    monkeypatch.setattr(sandbox.pool, "get_pool", refuse)


def test_kinds_registry():
    assert set(KINDS) == {"calc", "code", "files"}
    with pytest.raises(ValueError, match="must be one of"):
        make_env(EnvSpec("x", "nope"), generate_tasks(spec())[0])


def test_tasks_are_deterministic_and_seeded():
    a, b = generate_tasks(spec(seed=3)), generate_tasks(spec(seed=3))
    assert a == b
    assert [t.prompt for t in a] != [t.prompt for t in generate_tasks(spec(seed=4))]
    assert len({t.task_id for t in a}) == len(a) == 50


@pytest.mark.parametrize("level, pattern", [
    (1, r"What is \d{2,3} [+*] \d{2,3}\?"),
    (2, r"What is \d\d [-+*] \d\d [-+*] \d\d\?"),
    (3, r"What is (\(\d\d [-+*] \d\d\) [-+*] \d\d|\d\d [-+*] \(\d\d [-+*] \d\d\))\?"),
])
def test_levels_have_their_shape_and_true_answers(level, pattern):
    for task in generate_tasks(spec(level=level)):
        assert re.fullmatch(pattern, task.prompt), task.prompt
        expression = task.verifier["expression"]
        assert int(task.verifier["answer"]) == eval(expression)  # reference only: generated input
        assert task.metadata["level"] == level


def test_eval_split_size_and_disjointness():
    tasks = generate_tasks(spec(num_tasks=200, eval_fraction=0.25))
    train = {t.verifier["expression"] for t in tasks if t.split == "train"}
    evals = {t.verifier["expression"] for t in tasks if t.split == "eval"}
    assert len(evals) == 50 and len(train) == 150 and not train & evals
    assert tasks == generate_tasks(spec(num_tasks=200, eval_fraction=0.25))


def test_bad_level_is_rejected():
    with pytest.raises(ValueError, match="args.level"):
        generate_tasks(spec(level=7))


def run_episode(calls: list[ToolCall], answer=None, env_spec=None):
    env_spec = env_spec or spec()
    task = generate_tasks(env_spec)[0]
    env = make_env(env_spec, task)
    assert env.reset() == task.prompt
    results = [env.step(c) for c in calls]
    outcome = env.outcome(answer)
    env.close()
    return task, results, outcome


def test_calculator_step_observation_is_just_the_value():
    task = generate_tasks(spec())[0]
    _, results, _ = run_episode([ToolCall("calculator", {"expression": task.verifier["expression"]})])
    assert results[0].observation == task.verifier["answer"]
    assert results[0].result.exit_status == 0 and not results[0].done and results[0].side_effects == ()


def test_calculator_rejects_code_without_running_it():
    _, results, _ = run_episode([ToolCall("calculator", {"expression": "__import__('os').system('touch /tmp/x')"})])
    assert results[0].observation.startswith("error:") and results[0].result.exit_status == 1


def test_correct_answer_via_tool_scores_outcome_format_and_true_metric():
    task = generate_tasks(spec())[0]
    answer = task.verifier["answer"]
    _, results, outcome = run_episode([ToolCall("calculator", {"expression": task.verifier["expression"]}),
                                       ToolCall("answer", {"answer": answer})])
    assert results[-1].done
    assert outcome.reward_components["outcome"] == 1.0 and outcome.reward_components["format"] == 1.0
    assert outcome.true_metric == 1.0 and outcome.verified
    assert outcome.reward_components["tool_cost"] == pytest.approx(0.01)  # one calculator call
    # combine_reward: 1 * outcome + 0.5 * format - 0 * cost - safety
    weights = RewardWeights(outcome=1.0, format=0.5)
    assert combine_reward(outcome.reward_components, weights) == pytest.approx(1.5)


def test_wrong_answer_and_no_answer():
    _, _, wrong = run_episode([ToolCall("answer", {"answer": "-1"})])
    assert wrong.reward_components["outcome"] == 0.0 and wrong.reward_components["format"] == 1.0
    assert wrong.true_metric == 0.0 and not wrong.verified
    _, _, silent = run_episode([])
    assert silent.reward_components["outcome"] == 0.0 and silent.reward_components["format"] == 0.0
    task = generate_tasks(spec())[0]
    _, _, free_text = run_episode([], answer=task.verifier["answer"])  # answered outside the tool
    assert free_text.reward_components["outcome"] == 1.0 and free_text.reward_components["format"] == 0.0


@pytest.mark.parametrize("expression, credit", [
    ("742 * 14", 1.0), ("14 * 742", 1.0), ("(742) * 14", 1.0),  # the task's value, in any form
    ("742 + 14", 2 / 3), ("741 * 14", 2 / 3), ("741 + 14", 1 / 3), ("14 * 742 + 0", 1.0),
    ("742 * 14 * 2", 3 / 5), ("742", 1 / 3), ("hello", 0.0), ("", 0.0), (None, 0.0), (742, 0.0),
])
def test_expression_credit_counts_terms_in_place(expression, credit):
    assert expression_credit(expression, "742 * 14") == pytest.approx(credit)


def test_process_component_is_the_mean_credit_of_calculator_calls():
    task = generate_tasks(spec())[0]  # the task run_episode plays
    a, op, b = task.verifier["expression"].split()
    other = {"+": "*", "*": "+"}[op]
    _, results, outcome = run_episode([ToolCall("calculator", {"expression": f"{a} {other} {b}"}),
                                       ToolCall("calculator", {"expression": task.verifier["expression"]}),
                                       ToolCall("answer", {"answer": task.verifier["answer"]})])
    assert results[0].verdict.score == pytest.approx(2 / 3) and results[1].verdict.score == 1.0
    assert results[2].verdict is None  # the answer is the outcome's business
    assert outcome.reward_components["process"] == pytest.approx((2 / 3 + 1.0) / 2)
    _, _, no_calls = run_episode([ToolCall("answer", {"answer": "1"})])
    assert "process" not in no_calls.reward_components  # absent, not 0: nothing was judged


@pytest.mark.parametrize("text, value", [("1776", 1776), (" 1,776. ", 1776), ("-42", -42), ("$12$", 12),
                                         ("1776.5", None), ("about 1776", None), ("", None), (None, None)])
def test_answer_parsing_is_exact_integer(text, value):
    assert parse_integer(text) == value


def test_unknown_tool_and_steps_after_done_are_agent_errors():
    _, results, _ = run_episode([ToolCall("python", {"code": "1"}), ToolCall("answer", {"answer": "1"}),
                                 ToolCall("calculator", {"expression": "1"})])
    assert results[0].observation.startswith("error: unknown tool") and not results[0].done
    assert results[2].done and results[2].observation == "error: the episode is over"


def test_missing_argument_is_an_agent_error():
    _, results, _ = run_episode([ToolCall("calculator", {})])
    assert results[0].result.exit_status == 1 and "expression" in results[0].observation


def test_budgets_come_from_the_spec():
    env_spec = spec(budgets=Budgets(max_turns=2))
    env = make_env(env_spec, generate_tasks(env_spec)[0])
    assert [t.name for t in env.tools()] == ["calculator", "answer"]
    assert env.spec.budgets.max_turns == 2


def test_tool_delay_is_seeded_by_task_and_call_and_off_by_default(monkeypatch):
    import time

    from sandbox.envs import calc

    slept: list[float] = []
    monkeypatch.setattr(calc, "_sleep", slept.append)
    latency = {"tool_delay_s": 0.001, "slow_fraction": 0.3, "slow_factor": 10}

    def run(args, task, calls=12):
        env = make_env(EnvSpec("calc", "calc", {"level": 1, "num_tasks": 5, **args}), task)
        env.reset()
        started = time.monotonic()
        for _ in range(calls):
            assert env.step(ToolCall("calculator", {"expression": "2 + 3"})).observation == "5"
        return env.tool_delays, time.monotonic() - started  # the clock is reported, never asserted

    tasks = generate_tasks(spec(num_tasks=5))
    delays, _ = run(latency, tasks[0])
    assert slept == delays and len(delays) == 12
    assert set(delays) <= {0.001, 0.01} and 0.01 in delays and 0.001 in delays
    assert run(latency, tasks[0])[0] == delays  # deterministic per (task id, call index)
    assert [run(latency, t)[0] for t in tasks[1:]] != [delays] * 4  # and differs across tasks
    slept.clear()
    assert run({}, tasks[0])[0] == [0.0] * 12 and slept == []  # default: no delay at all
    with pytest.raises(ValueError, match="slow_fraction"):
        generate_tasks(EnvSpec("calc", "calc", {"level": 1, "num_tasks": 5, "slow_fraction": 2}))
