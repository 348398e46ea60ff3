"""The agent loop: token-exact trajectories, invalid loops, infra errors never scored, budgets.

Scripted episodes run the real `calc` env on a FakeEngine that replays fixed token ids, so
every turn is known; the last two tests run the real JaxEngine (random tiny model) and check
the trajectory against the engine's raw outputs and the learner's logprobs. Nothing here
decodes and re-encodes a turn: expected ids come from the engine's records.

Run: .venv/bin/python -m pytest tests/rollout/test_agent.py -q -s
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import numpy as np
import pytest

from rollout import chat
from rollout.agent import AgentLoop
from rollout.api import (EnvTurn, GroupRequest, PolicyTurn, SamplingParams, Termination,
                         token_stream)
from rollout.config import AgentConfig
from rollout.fake import FakeEngine
from sandbox.api import (Budgets, EnvInfraError, EnvSpec, InfraErrorClass, Outcome, StepResult,
                         Task, ToolResult, ToolSpec)
from sandbox.client import open_env as open_builtin_env
from tests.rollout.conftest import learner_logprobs

TASK = Task(task_id="t-2+3", prompt="What is 2 + 3?", verifier={"answer": 5, "expression": "2 + 3"})
CALC = EnvSpec(name="calc", kind="calc", tasks=(TASK,))


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def scripted(tokenizer, *turns: str) -> FakeEngine:
    """An engine whose turn k (from the request id) is the ids of turns[k] (the last repeats)."""
    ids = [tokenizer.encode(t) for t in turns]
    return FakeEngine(lambda r: ids[min(int(r.request_id.rsplit(":", 1)[1]), len(ids) - 1)])


def group(spec=CALC, size=1, **sampling) -> GroupRequest:
    return GroupRequest("g", spec, TASK, size, SamplingParams(**sampling))


def run(engine, tokenizer, spec=CALC, open_env=open_builtin_env, **config):
    loop = AgentLoop(engine, tokenizer, open_env, AgentConfig(**config))
    return loop.run_episode(group(spec), 0)


def test_two_policy_turns_and_a_tool_turn_are_the_engines_tokens(tokenizer):
    engine = scripted(tokenizer, "Let me compute." + call("calculator", expression="2+3"),
                      call("answer", answer="5"))
    traj = run(engine, tokenizer)
    assert traj.termination is Termination.DONE and traj.reward == 1.0 and traj.true_metric == 1.0
    kinds = [type(t) for t in traj.turns]
    assert kinds == [PolicyTurn, EnvTurn, PolicyTurn, EnvTurn]
    first, second = engine.generations
    # Policy turns are the engine's raw outputs, token by token.
    for turn, gen in zip(traj.policy_turns, engine.generations):
        assert (turn.token_ids, turn.logprobs, turn.versions) == (gen.token_ids, gen.logprobs,
                                                                  gen.versions)
    # The tool turn is exactly the inserted observation; the engine saw exactly this context.
    tool_turn = traj.turns[1]
    assert tool_turn.tool_call.name == "calculator" and tool_turn.result.output == "5"
    assert tool_turn.token_ids == chat.observation_tokens(tokenizer, "5", first.token_ids)
    assert engine.requests[1].prompt_ids == traj.prompt_ids + first.token_ids + tool_turn.token_ids
    # The answer call ends the episode: recorded, nothing inserted after it.
    assert traj.turns[3].tool_call.name == "answer" and traj.turns[3].token_ids == ()
    stream = token_stream(traj)
    assert tuple(stream.tokens) == engine.requests[1].prompt_ids + second.token_ids
    p0, p1 = len(engine.requests[0].prompt_ids), len(engine.requests[1].prompt_ids)
    policy = [*range(p0, p0 + len(first.token_ids)), *range(p1, p1 + len(second.token_ids))]
    assert np.flatnonzero(stream.loss_mask).tolist() == policy
    assert engine.requests[0].session_id == engine.requests[1].session_id == traj.trajectory_id
    assert engine.released == [traj.trajectory_id]


def test_malformed_calls_end_in_an_invalid_loop_and_are_scored(tokenizer):
    engine = scripted(tokenizer, "<tool_call>{not json</tool_call>")
    traj = run(engine, tokenizer, max_consecutive_invalid=3)
    assert traj.termination is Termination.INVALID_LOOP
    assert len(traj.policy_turns) == 3 and traj.infra_error is InfraErrorClass.NONE
    env_turns = [t for t in traj.turns if isinstance(t, EnvTurn)]
    assert all("not valid JSON" in t.invalid_call for t in env_turns)
    assert [bool(t.token_ids) for t in env_turns] == [True, True, False]
    assert traj.reward_components["outcome"] == 0.0  # scored, not dropped


def test_the_same_call_repeated_without_progress_is_an_invalid_loop(tokenizer):
    engine = scripted(tokenizer, call("calculator", expression="2+3"))
    traj = run(engine, tokenizer, max_repeated_calls=3)
    assert traj.termination is Termination.INVALID_LOOP and len(traj.policy_turns) == 3


class BrokenEnv:
    """An Env whose step fails for infrastructure reasons, or hangs."""

    def __init__(self, mode: str):
        self.mode, self.closed = mode, False

    def reset(self):
        return "What is 2 + 3?"

    def tools(self):
        return (ToolSpec("calculator", parameters={"properties": {"expression": {}}}),)

    def step(self, call):
        if self.mode == "hang":
            time.sleep(5)
        raise EnvInfraError(InfraErrorClass.TOOL_TIMEOUT, "sandbox missed its deadline")

    def outcome(self, answer):
        return Outcome({"outcome": 1.0}, 1.0, True)

    def close(self):
        self.closed = True


@pytest.mark.parametrize("mode, error", [("raise", InfraErrorClass.TOOL_TIMEOUT),
                                         ("hang", InfraErrorClass.ENV_TIMEOUT)])
def test_infra_errors_are_flagged_never_scored(tokenizer, mode, error):
    engine = scripted(tokenizer, call("calculator", expression="2+3"))
    env = BrokenEnv(mode)
    traj = run(engine, tokenizer, open_env=lambda spec, task: env, env_call_timeout_s=0.3)
    assert traj.termination is Termination.INFRA_ERROR and traj.infra_error is error
    assert traj.reward == 0.0 and traj.reward_components == {} and env.closed


def test_unreachable_env_is_an_infra_error(tokenizer):
    def unreachable(spec, task):
        raise EnvInfraError(InfraErrorClass.ENV_UNREACHABLE, "connection refused")

    traj = run(scripted(tokenizer, "x"), tokenizer, open_env=unreachable)
    assert traj.infra_error is InfraErrorClass.ENV_UNREACHABLE and traj.turns == ()


def test_budgets_end_episodes(tokenizer):
    calls = [call("calculator", expression=f"2+{i}") for i in range(10)]
    engine = scripted(tokenizer, *calls)
    turns = dataclasses.replace(CALC, budgets=Budgets(max_turns=2))
    traj = run(engine, tokenizer, spec=turns)
    assert traj.termination is Termination.MAX_TURNS and len(traj.policy_turns) == 2
    assert traj.turns[-1].token_ids == ()  # nothing inserted when no turn follows

    prompt_len = len(run(scripted(tokenizer, "5"), tokenizer).prompt_ids)
    tokens = dataclasses.replace(CALC, budgets=Budgets(max_total_tokens=prompt_len + 40))
    traj = run(scripted(tokenizer, *calls), tokenizer, spec=tokens)
    assert traj.termination is Termination.MAX_TOKENS
    assert len(token_stream(traj).tokens) <= prompt_len + 40

    costly = (ToolSpec("calculator", parameters={"properties": {"expression": {}}},
                       cost_per_call=1.0), ToolSpec("answer"))
    cost = dataclasses.replace(CALC, tools=costly, budgets=Budgets(max_tool_cost=1.5))
    traj = run(scripted(tokenizer, *calls), tokenizer, spec=cost)
    assert traj.termination is Termination.MAX_TOOL_COST and len(traj.policy_turns) == 2
    assert traj.reward_components["tool_cost"] == 2.0


def test_plain_reply_is_the_answer(tokenizer):
    traj = run(scripted(tokenizer, "5<|im_end|>"), tokenizer)
    assert traj.termination is Termination.DONE and traj.true_metric == 1.0


def test_real_engine_episode_matches_engine_outputs_and_learner_logprobs(engine, model,
                                                                        tokenizer):
    """Multi-turn on the real engine (plain replies count as invalid, so turns continue)."""
    recorded = []
    real_submit = engine.submit

    class Recording:
        version = engine.version
        max_context = engine.max_context
        submit = staticmethod(lambda r: recorded.append((r, real_submit(r))) or recorded[-1][1])
        release_session = staticmethod(engine.release_session)
        abort = staticmethod(engine.abort)

    spec = dataclasses.replace(CALC, budgets=Budgets(max_turns=3, max_new_tokens_per_turn=8))
    loop = AgentLoop(Recording(), tokenizer, open_builtin_env,
                     AgentConfig(plain_reply_is_answer=False, max_consecutive_invalid=3))
    reused_before = engine.stats["reused_tokens"]
    traj = loop.run_episode(GroupRequest("real", spec, TASK, 1, SamplingParams()), 0)
    assert traj.termination is Termination.INVALID_LOOP and len(traj.policy_turns) == 3
    stream = token_stream(traj)
    for (request, future), turn in zip(recorded, traj.policy_turns):
        gen = future.result()
        assert turn.token_ids == gen.token_ids and turn.logprobs == gen.logprobs
        start = len(request.prompt_ids)
        assert tuple(stream.tokens[:start]) == request.prompt_ids
        assert tuple(stream.tokens[start:start + len(gen.token_ids)]) == gen.token_ids
    assert engine.stats["reused_tokens"] - reused_before >= len(recorded[1][0].prompt_ids) - 40
    config, params = model
    learner = learner_logprobs(params, config, stream.tokens)
    mask = stream.loss_mask[1:] > 0
    gap = np.max(np.abs(learner[mask] - stream.behaviour_logprobs[1:][mask]))
    print(f"\nepisode behaviour vs learner logprob max |gap|: {gap:.2e}")
    assert gap < 1e-4


def test_group_runs_samples_concurrently_with_distinct_seeds(engine, tokenizer):
    spec = dataclasses.replace(CALC, budgets=Budgets(max_turns=2, max_new_tokens_per_turn=8))
    loop = AgentLoop(engine, tokenizer, open_builtin_env, AgentConfig(plain_reply_is_answer=False))
    request = GroupRequest("grp", spec, TASK, 4, SamplingParams(temperature=1.0, seed=3))
    trajectories = list(loop.run_group(request))
    assert sorted(t.trajectory_id for t in trajectories) == [f"grp:0:{i}" for i in range(4)]
    firsts = {t.policy_turns[0].token_ids for t in trajectories}
    assert len(firsts) == 4  # each sample draws its own noise
    abort = threading.Event()
    abort.set()
    aborted = list(loop.run_group(dataclasses.replace(request, group_id="ab"), abort))
    assert {t.termination for t in aborted} == {Termination.ABORTED}
    assert {t.infra_error for t in aborted} == {InfraErrorClass.WORKER_LOST}  # never scored
