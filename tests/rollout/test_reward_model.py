"""The learned reward model: scores from the worker match an in-process reference, the head
matters, a hung worker ends within its deadline as VERIFIER_TIMEOUT, and the agent loop adds
the "reward_model" component (weighted) or marks the trajectory as an infra error.

Workers are spawned processes (each imports JAX and compiles once); the JAX persistent
compilation cache of conftest.py is handed to them through the environment.

Run: .venv/bin/python -m pytest tests/rollout/test_reward_model.py -q
"""

from __future__ import annotations

import json
import os
import time

import flax.linen as nn
import jax
import numpy as np
import pytest

from model import decoder
from model.hf_io import load_hf
from rollout.agent import AgentLoop
from rollout.api import GroupRequest, SamplingParams, Termination, token_stream
from rollout.config import AgentConfig
from rollout.fake import FakeEngine
from rollout.reward_model import (TEST_DELAY_ENV, RewardModelScorer, load_reward_model,
                                  save_reward_model)
from sandbox.api import EnvInfraError, EnvSpec, InfraErrorClass, RewardWeights, Task
from sandbox.client import open_env as open_builtin_env
from tests.rollout.conftest import COMPILE_CACHE_ENV, sharpen

TASK = Task(task_id="t-2+3", prompt="What is 2 + 3?", verifier={"answer": 5, "expression": "2 + 3"})


@pytest.fixture(scope="module", autouse=True)
def worker_env():
    """Workers inherit the environment at spawn: share the compile cache with them."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in COMPILE_CACHE_ENV.items():
            mp.setenv(key, value)
        yield


@pytest.fixture(scope="module")
def reward_models(tiny_model_dir, tmp_path_factory):
    """Two reward-model folders: the same (sharpened) tiny decoder, two hand-set heads."""
    config, params = load_hf(tiny_model_dir)
    params = sharpen(params, seed=3)
    d = config.hidden_size
    heads = {"a": {"weight": np.linspace(-1.0, 1.0, d, dtype=np.float32),
                   "bias": np.float32(0.25)},
             "b": {"weight": np.cos(np.arange(d, dtype=np.float32)), "bias": np.float32(-0.5)}}
    root = tmp_path_factory.mktemp("reward-models")
    return {name: save_reward_model(root / name, config, params, head,
                                    tokenizer_dir=tiny_model_dir)
            for name, head in heads.items()}


def reference_score(folder, tokens) -> float:
    """In-process: model.decoder.forward on the unpadded sequence, final_norm output grabbed,
    head applied to the last token in numpy."""
    config, params, head = load_reward_model(folder)
    grabbed = []

    def grab(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.module.name == "final_norm":
            grabbed.append(out)
        return out

    with nn.intercept_methods(grab):
        decoder.forward(jax.device_put(params), config, np.asarray([tokens], np.int32))
    hidden = np.asarray(grabbed[0], np.float32)[0, -1]
    return float(hidden @ head["weight"] + head["bias"])


def test_worker_scores_match_the_reference_and_the_head_matters(reward_models, tokenizer):
    tokens = tokenizer.encode("What is 2 + 3? The answer is 5.")
    scorers = {name: RewardModelScorer(folder, timeout_s=60.0)
               for name, folder in reward_models.items()}
    try:
        for scorer in scorers.values():
            scorer.start()  # both workers load concurrently
        scores = {name: scorer.score(tokens) for name, scorer in scorers.items()}
        assert scorers["a"].score(tokens) == scores["a"]  # deterministic, worker reused
    finally:
        for scorer in scorers.values():
            scorer.close()
    for name, folder in reward_models.items():
        assert scores[name] == pytest.approx(reference_score(folder, tokens), abs=1e-4)
    assert abs(scores["a"] - scores["b"]) > 1e-3


def test_a_hung_worker_ends_within_its_deadline_as_verifier_timeout(reward_models, monkeypatch):
    monkeypatch.setenv(TEST_DELAY_ENV, "60")  # every answer of this worker takes a minute
    with RewardModelScorer(reward_models["a"], timeout_s=1.0) as scorer:
        scorer.start(wait=True)
        hung = scorer.pid
        start = time.monotonic()
        with pytest.raises(EnvInfraError) as err:
            scorer.score([5, 6, 7])
        elapsed = time.monotonic() - start
        assert err.value.error_class is InfraErrorClass.VERIFIER_TIMEOUT
        assert 1.0 <= elapsed < 4.0
        assert scorer.pid is not None and scorer.pid != hung  # killed and restarted
        with pytest.raises(ProcessLookupError):
            os.kill(hung, 0)


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def episode(tokenizer, spec: EnvSpec):
    ids = [tokenizer.encode(call("calculator", expression="2+3")),
           tokenizer.encode(call("answer", answer="5"))]
    engine = FakeEngine(lambda r: ids[min(int(r.request_id.rsplit(":", 1)[1]), 1)])
    loop = AgentLoop(engine, tokenizer, open_builtin_env, AgentConfig())
    try:
        return loop.run_episode(GroupRequest("g", spec, TASK, 1, SamplingParams()), 0)
    finally:
        loop.close()


def test_agent_loop_adds_the_weighted_reward_model_component(reward_models, tokenizer):
    spec = EnvSpec(name="calc", kind="calc", tasks=(TASK,),
                   args={"reward_model": str(reward_models["b"]), "reward_model_timeout_s": 60},
                   reward=RewardWeights(outcome=1.0, reward_model=0.5))
    traj = episode(tokenizer, spec)
    assert traj.termination is Termination.DONE and traj.infra_error is InfraErrorClass.NONE
    expected = reference_score(reward_models["b"], token_stream(traj).tokens.tolist())
    assert traj.reward_components["reward_model"] == pytest.approx(expected, abs=1e-4)
    assert traj.reward_components["outcome"] == 1.0
    assert traj.reward == pytest.approx(1.0 + 0.5 * traj.reward_components["reward_model"])


def test_a_failing_reward_model_marks_the_trajectory_as_an_infra_error(tokenizer, tmp_path):
    spec = EnvSpec(name="calc", kind="calc", tasks=(TASK,),
                   args={"reward_model": str(tmp_path / "missing")},
                   reward=RewardWeights(reward_model=1.0))
    traj = episode(tokenizer, spec)
    assert traj.termination is Termination.INFRA_ERROR
    assert traj.infra_error is InfraErrorClass.VERIFIER_CRASH
    assert traj.reward == 0.0 and traj.reward_components == {}
