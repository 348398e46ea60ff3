"""The loop's pure parts: config loading, task cursors, batching and rollout metrics.

Run: `.venv/bin/python -m pytest tests/controller/test_loop_parts.py -q`.
"""

import numpy as np
import pytest

from controller import config as config_lib
from controller.batching import make_batch
from controller.loop_async import admit
from controller.pipeline import every
from controller.stats import rollout_metrics, split_infra, staleness_histogram
from controller.tasks import TaskSource
from rollout.api import EnvTurn, FinishReason, PolicyTurn, Termination, Trajectory
from sandbox.api import EnvSpec, InfraErrorClass, Task, ToolCall, ToolResult


def _trajectory(reward, true_metric=None, version=3, tid="t", infra=InfraErrorClass.NONE, n_policy=3):
    policy = PolicyTurn(tuple(range(10, 10 + n_policy)), (-0.5,) * n_policy, (version,) * n_policy, FinishReason.STOP)
    env = EnvTurn((7, 8), ToolCall("calculator", {"expression": "1+1"}), ToolResult(output="2", cost=0.5))
    answer = PolicyTurn((20, 21), (-0.1, -0.2), (version, version + 1), FinishReason.STOP)
    return Trajectory(tid, "task", "calc", "g", 0, (1, 2, 3), (policy, env, answer),
                      Termination.INFRA_ERROR if infra is not InfraErrorClass.NONE else Termination.DONE,
                      {"outcome": reward}, reward, reward if true_metric is None else true_metric, infra_error=infra)


def test_config_layers_yaml_overrides_and_flags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 7\nlearner:\n  learning_rate: 1e-4\ndata:\n  group_size: 4\n")
    config = config_lib.load(str(path), ("data.group_size=6",), steps=9, **{"fleet.workers": 1})
    assert (config.steps, config.learner.learning_rate, config.data.group_size, config.fleet.workers) == (9, 1e-4, 6, 1)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match=r"config.data: unknown key\(s\) \['groups'\]; valid keys are"):
        config_lib.load(None, ("data.groups=3",))
    with pytest.raises(ValueError, match=r"config.steps: must be int, got 'many'"):
        config_lib.load(None, ("steps=many",))
    with pytest.raises(ValueError, match=r"RunConfig.mode must be one of \['sync', 'async'\], got 'eager'"):
        config_lib.load(None, mode="eager")


def test_task_source_walks_each_task_once_per_epoch_and_resumes():
    tasks = [Task(f"t{i}", "p", split="eval" if i < 2 else "train") for i in range(10)]
    spec = EnvSpec(name="e", kind="calc", tasks=tuple(tasks))
    source = TaskSource(seed=1)
    first = [source.next_task(spec).task_id for _ in range(8)]
    assert sorted(first) == [f"t{i}" for i in range(2, 10)]  # train split only, no repeats
    assert [t.task_id for t in source.eval_tasks(spec, 5)] == ["t0", "t1"]
    state = source.state()
    upcoming = [source.next_task(spec).task_id for _ in range(5)]
    resumed = TaskSource(seed=1)
    resumed.load_state(state, {"e": spec})
    assert [resumed.next_task(spec).task_id for _ in range(5)] == upcoming


def test_make_batch_skips_constant_groups_and_masks_policy_tokens_only():
    varied = [_trajectory(1.0, tid="a"), _trajectory(0.0, tid="b")]
    constant = [_trajectory(1.0, tid="c"), _trajectory(1.0, tid="d")]
    plan = make_batch([varied, constant], "grpo", row_multiple=1)
    assert plan.metrics["batch/skipped_groups"] == 1.0
    assert [t.trajectory_id for t in plan.trajectories] == ["a", "b"]
    batch = plan.batch
    # prompt (3) + policy (3) + env (2) + policy (2) = 10 tokens; mask on the 5 policy tokens
    np.testing.assert_array_equal(batch.loss_mask_bt[0, :10], [0, 0, 0, 1, 1, 1, 0, 0, 1, 1])
    np.testing.assert_array_equal(batch.tokens_bt[0, :10], [1, 2, 3, 10, 11, 12, 7, 8, 20, 21])
    # GRPO on rewards (1, 0): mean 0.5, std 0.5 -> advantages +1 and -1 on policy tokens
    np.testing.assert_allclose(batch.advantages_bt[0, 3], 1.0, atol=1e-4)
    np.testing.assert_allclose(batch.advantages_bt[1, 3], -1.0, atol=1e-4)
    assert np.all(batch.advantages_bt[:, :3] == 0)


def test_make_batch_with_only_constant_groups_trains_nothing():
    plan = make_batch([[_trajectory(0.0), _trajectory(0.0)]], "grpo", row_multiple=1)
    assert plan.batch is None and plan.metrics["batch/skipped_groups"] == 1.0


def test_rollout_metrics_and_infra_errors_are_kept_apart():
    good = [_trajectory(1.0), _trajectory(0.0, true_metric=1.0)]
    lost = _trajectory(0.0, infra=InfraErrorClass.ENV_TIMEOUT)
    scored, errors = split_infra(good + [lost])
    assert scored == good and errors == {"env_timeout": 1}
    metrics = rollout_metrics(scored, learner_version=4)
    assert metrics["rollout/success_rate"] == 1.0  # the true metric, not the reward
    assert metrics["reward/mean"] == 0.5
    assert metrics["rollout/tool_calls"] == 1.0 and metrics["rollout/tool_cost"] == 0.5
    assert metrics["rollout/turns"] == 2.0
    assert metrics["staleness/max"] == 1.0  # oldest token version 3, learner at 4
    assert staleness_histogram(scored, 5) == {2: 2}


def test_admit_checks_the_oldest_token_of_each_sample():
    group = [_trajectory(1.0, version=5, tid="new"), _trajectory(0.0, version=2, tid="old")]
    fresh, dropped = admit(group, version=6, max_staleness=2)
    assert [t.trajectory_id for t in fresh] == ["new"] and dropped == 1


def test_every_runs_on_period_and_on_the_last_step():
    assert [s for s in range(7) if every(3, s, 7)] == [2, 5, 6]
    assert not any(every(0, s, 7) for s in range(7))


def test_minibatches_split_informative_groups_whole():
    from controller.batching import make_minibatches

    groups = [[_trajectory(1.0, tid=f"{g}a"), _trajectory(0.0, tid=f"{g}b")] for g in range(3)]
    groups.append([_trajectory(1.0, tid="ca"), _trajectory(1.0, tid="cb")])  # constant: no signal
    plans = make_minibatches(groups, "grpo", row_multiple=1, minibatches=2)
    ids = [[t.trajectory_id for t in p.trajectories] for p in plans]
    assert ids == [["0a", "0b", "2a", "2b"], ["1a", "1b"]]
    # each group's advantages are the same as in one big batch: +1 / -1
    np.testing.assert_allclose(plans[1].batch.advantages_bt[:2, 3], [1.0, -1.0], atol=1e-4)
