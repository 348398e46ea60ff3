"""The embedded demo's model and its short supervised warm start.

RL needs a policy that sometimes succeeds: a group where every sample scores 0 teaches
nothing. So before GRPO the tiny model imitates demonstrations for a few minutes at most.

Demonstrations are made by the real agent loop (`rollout.agent`) driven by a scripted
policy (`ScriptedEngine`) that emits an expert's tool calls, so their tokens, roles and loss
mask are exactly what RL will see later — there is no second rendering of the chat format.
For `calc` the expert calls the calculator on the task's expression, then answers with the
result.

The model is made once per run directory (`model.factory.make_tiny_model`) with a BPE
tokenizer trained on text of the same environment, so tool-call boilerplate is few tokens.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import pathlib
from typing import Iterator, Sequence

import numpy as np

from controller.config import EnvConfig, ModelSetup, WarmStartConfig
from learner.api import Batch
from model.tokenizer import Tokenizer, render_chat
from rollout import chat
from rollout.agent import AgentLoop
from rollout.api import FinishReason, Generation, GenerationRequest, GroupRequest, SamplingParams, Trajectory, token_stream
from rollout.config import AgentConfig
from rollout.tool_parser import CLOSE, OPEN
from sandbox import api as sandbox_api
from sandbox.envs import make_env

logger = logging.getLogger(__name__)


def default_env_spec(env: EnvConfig) -> sandbox_api.EnvSpec:
    return sandbox_api.EnvSpec(
        name=f"{env.kind}-l{env.level}",
        kind=env.kind,
        args={"level": env.level, "num_tasks": env.num_tasks, "seed": 0,
              # latency args only when set, so default runs keep their args (and model cache stamp)
              **{k: getattr(env, k) for k in ("tool_delay_s", "slow_fraction", "slow_factor") if getattr(env, k)}},
        budgets=sandbox_api.Budgets(max_turns=env.max_turns, max_new_tokens_per_turn=env.max_new_tokens_per_turn,
                                    max_total_tokens=env.max_total_tokens),
        reward=sandbox_api.RewardWeights(outcome=1.0, process=env.process_reward, format=0.1),
        eval_fraction=env.eval_fraction,
    )


def expert_calls(task: sandbox_api.Task) -> list[sandbox_api.ToolCall]:
    """The scripted expert's tool calls for a task (built-in `calc` only)."""
    expression, answer = task.verifier.get("expression"), task.verifier.get("answer")
    if expression is None or answer is None:
        raise ValueError(f"task {task.task_id!r}: no scripted demonstration (needs verifier.expression and .answer)")
    return [sandbox_api.ToolCall("calculator", {"expression": str(expression)}),
            sandbox_api.ToolCall("answer", {"answer": str(answer)})]


def format_tool_call(call: sandbox_api.ToolCall) -> str:
    """A call as the policy writes it (the one format `rollout.tool_parser` reads)."""
    return OPEN + json.dumps({"name": call.name, "arguments": dict(call.arguments)}) + CLOSE


class ScriptedEngine:
    """An `Engine` that replies with a fixed list of tool calls, one per turn (logprob 0, version 0)."""

    def __init__(self, tokenizer: Tokenizer, calls: Sequence[sandbox_api.ToolCall]):
        self._turns = [tokenizer.encode(format_tool_call(c)) for c in calls]
        self._next = 0
        self.version = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for request in requests:
            ids = self._turns[min(self._next, len(self._turns) - 1)]
            self._next += 1
            out.append(Generation(request.request_id, tuple(ids), (0.0,) * len(ids), (0,) * len(ids),
                                  FinishReason.STOP))
        return out

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(self.generate([request])[0])
        return future

    def load_weights(self, version) -> float:
        return 0.0


def demonstrations(model_dir: pathlib.Path, spec: sandbox_api.EnvSpec, tasks: Sequence[sandbox_api.Task],
                   limit: int = 2000) -> list[Trajectory]:
    """Expert trajectories through the real agent loop; only the successful ones are kept."""
    tokenizer = Tokenizer.from_dir(model_dir)
    demos = []
    sampling = SamplingParams(temperature=1.0, max_new_tokens=spec.budgets.max_new_tokens_per_turn)
    for i, task in enumerate(list(tasks)[:limit]):
        loop = AgentLoop(engine=ScriptedEngine(tokenizer, expert_calls(task)), tokenizer=tokenizer,
                         open_env=make_env)
        request = GroupRequest(group_id=f"demo-{i}", env=spec, task=task, group_size=1, sampling=sampling)
        trajectory = loop.run_episode(request, 0)
        if trajectory.true_metric > 0:
            demos.append(trajectory)
    if not demos:
        raise RuntimeError(f"env {spec.name!r}: the scripted expert solved none of {len(tasks)} tasks")
    logger.info("warm start: %d expert demonstrations of %s", len(demos), spec.name)
    return demos


def sft_batches(demos: list[Trajectory], config: WarmStartConfig, row_multiple: int, seed: int) -> Iterator[Batch]:
    rng = np.random.default_rng(seed)
    streams = [token_stream(t) for t in demos]
    for _ in range(config.steps):
        rows = rng.choice(len(streams), size=min(config.batch_size, len(streams)), replace=False)
        picked = [streams[i] for i in rows]
        yield Batch.from_sequences(
            tokens=[s.tokens for s in picked],
            loss_masks=[s.loss_mask for s in picked],
            behaviour_logprobs=[np.zeros_like(s.loss_mask) for s in picked],
            advantages=[np.float32(0.0) for _ in picked],
            row_multiple=row_multiple,
        )


def _corpus(spec: sandbox_api.EnvSpec) -> list[str]:
    """Text in the shape of the env's episodes (system message included), for training the tokenizer."""
    from sandbox.envs import generate_tasks

    lines = []
    tasks = generate_tasks(spec)[:1500]
    env = make_env(spec, tasks[0])
    system = chat.system_message(AgentConfig().system_prompt, env.tools(), AgentConfig().tool_schema)
    env.close()
    for task in tasks:
        calls = expert_calls(task)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]
        for call in calls:
            messages.append({"role": "assistant", "content": format_tool_call(call)})
            messages.append({"role": "user", "content": f"<tool_response>{task.verifier['answer']}</tool_response>"})
        lines.append(render_chat(messages))
    return lines


def ensure_model(setup: ModelSetup, run_dir: pathlib.Path, spec: sandbox_api.EnvSpec) -> pathlib.Path:
    """The policy's HF folder: the given path, or a tiny model made once and cached in the run dir."""
    if setup.path:
        return pathlib.Path(setup.path)
    out = run_dir / "model"
    stamp = hashlib.sha256(json.dumps([dataclasses.asdict(setup), spec.kind, dict(spec.args)],
                                      sort_keys=True).encode()).hexdigest()[:16]
    stamp_file = out / "orrery-model.stamp"
    if stamp_file.exists() and stamp_file.read_text() == stamp:
        logger.info("reusing the tiny model in %s", out)
        return out
    from model.factory import make_tiny_model

    logger.info("making a tiny model in %s", out)
    make_tiny_model(out, _corpus(spec), vocab_size=setup.vocab_size, hidden_size=setup.hidden_size,
                    num_layers=setup.num_layers, num_heads=setup.num_heads, num_kv_heads=setup.num_kv_heads,
                    seed=setup.seed)
    stamp_file.write_text(stamp)
    return out
