"""The multi-turn agent loop: one task in, one token-exact Trajectory out.

What it is: `AgentLoop.run_episode` renders the task (`rollout/chat.py`), then repeats

    sample a policy turn on the engine (stops after </tool_call> or at <|im_end|>)
    parse its tool call (`rollout/tool_parser.py`)
    run the call through the Env, with a deadline
    insert the observation tokens (`chat.observation_tokens`, loss-masked)

until the env says done (the `answer` tool), the policy replies without a tool call (that
reply is its answer; with `plain_reply_is_answer=False` it is a malformed call instead), or a
budget runs out (turns, tokens, tool cost, and the engine's context length). `run_group` runs a
GRPO group's samples as concurrent episodes (threads) on the one shared engine, whose
scheduler batches their turns, and yields trajectories as they finish.

Token-exact (DESIGN.md rule 1): a PolicyTurn holds exactly the engine's token ids, logprobs and
versions; an EnvTurn holds exactly the inserted ids. Text is decoded only to parse calls.

Failures, by who caused them:
- the agent: a malformed call becomes an "error: ..." observation and counts; after
  `max_consecutive_invalid` of them in a row, or the same call with the same observation
  `max_repeated_calls` times in a row, the episode ends as INVALID_LOOP and is scored;
- infrastructure (rule 3): EnvInfraError, a missed env/verifier deadline, an engine error or
  timeout, or an unexpected exception from the env end the episode as INFRA_ERROR with its
  class, reward 0 and empty components; an aborted episode (abort, group deadline, shutdown)
  ends as ABORTED with class WORKER_LOST. The controller drops every trajectory whose
  infra_error is not NONE and counts it by class; such trajectories are never scored.

Reward: the env's unweighted `Outcome.reward_components` (with "tool_cost" and "safety" filled in
when the env left them out) combined by `sandbox.api.combine_reward` with the env's weights.
A learned reward model is one more component: when `EnvSpec.args` has `reward_model: <folder>`
(written by `rollout.reward_model.save_reward_model`; optional `reward_model_timeout_s`, default
30), the finished trajectory's token stream (prompt + turns, `rollout.api.token_stream`) is scored
in a worker process (`rollout.reward_model.RewardModelScorer`, one per folder and timeout, cached
in the AgentLoop) and added as component "reward_model" (weight `RewardWeights.reward_model`).
Its timeout or crash is an infra error like any verifier's (VERIFIER_TIMEOUT / VERIFIER_CRASH).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator

from model.tokenizer import Tokenizer
from rollout import chat
from rollout.api import (
    Engine,
    EngineError,
    EnvTurn,
    FinishReason,
    Generation,
    GenerationRequest,
    GroupRequest,
    PolicyTurn,
    SamplingParams,
    Termination,
    Timings,
    Trajectory,
    Turn,
    token_stream,
)
from rollout.config import AgentConfig
from rollout.reward_model import RewardModelScorer
from rollout.tool_parser import parse_tool_call
from sandbox.api import (
    Env,
    EnvInfraError,
    EnvSpec,
    InfraErrorClass,
    SamplingOverrides,
    Task,
    ToolCall,
    combine_reward,
)

logger = logging.getLogger(__name__)

OpenEnv = Callable[[EnvSpec, Task], Env]
# An aborted episode (abort, group deadline, shutdown) is one the worker did not deliver: it is
# flagged like an infra error so that no consumer can mistake it for a scored 0.
_ABORTED_CLASS = InfraErrorClass.WORKER_LOST


class _Stop(Exception):
    """Ends an episode early with a termination reason (and an infra class for INFRA_ERROR)."""

    def __init__(self, termination: Termination, infra: InfraErrorClass = InfraErrorClass.NONE):
        super().__init__(termination.value)
        self.termination, self.infra = termination, infra


def derive_seed(*parts: Any) -> int:
    """A 32-bit seed from any parts (group, sample, turn): distinct samples never share noise."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


def apply_overrides(sampling: SamplingParams, overrides: SamplingOverrides) -> SamplingParams:
    changes = {k: v for k, v in dataclasses.asdict(overrides).items() if v is not None}
    return dataclasses.replace(sampling, **changes)


def call_with_deadline(fn: Callable[[], Any], timeout_s: float, error_class: InfraErrorClass,
                       what: str) -> Any:
    """Run fn on a daemon thread; a miss raises EnvInfraError(error_class) (the call is abandoned)."""
    box: dict[str, Any] = {}
    finished = threading.Event()

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e
        finished.set()

    threading.Thread(target=target, name=f"deadline:{what}", daemon=True).start()
    if not finished.wait(timeout_s):
        raise EnvInfraError(error_class, f"{what} missed its {timeout_s:.1f}s deadline")
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclasses.dataclass
class AgentLoop:
    """Runs episodes on one engine. Thread-safe: one instance serves every group of a worker."""

    engine: Engine
    tokenizer: Tokenizer
    open_env: OpenEnv
    config: AgentConfig = AgentConfig()
    max_context: int | None = None  # context limit in tokens; None: the engine's `max_context`
    seed: int = 0  # the worker's seed, mixed into every sample's sampling seed
    _scorers: dict[tuple[str, float], RewardModelScorer] = dataclasses.field(
        default_factory=dict, init=False, repr=False)
    _scorers_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock,
                                                      init=False, repr=False)

    def reward_model(self, folder: str, timeout_s: float) -> RewardModelScorer:
        """The cached scorer of the reward model in `folder` (one worker per folder and timeout)."""
        key = (str(folder), float(timeout_s))
        with self._scorers_lock:
            if key not in self._scorers:
                self._scorers[key] = RewardModelScorer(folder, timeout_s)
            return self._scorers[key]

    def close(self) -> None:
        """Stop the reward-model workers (they also end with this process)."""
        with self._scorers_lock:
            scorers, self._scorers = list(self._scorers.values()), {}
        for scorer in scorers:
            scorer.close()

    def run_group(self, request: GroupRequest, abort: threading.Event | None = None,
                  deadline_s: float | None = None) -> Iterator[Trajectory]:
        """Yield the group's `group_size` trajectories as they finish (episodes run concurrently).

        Setting `abort`, passing `deadline_s` (seconds from now), or closing the iterator ends
        unfinished episodes as ABORTED."""
        abort = abort or threading.Event()
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        finished: queue.Queue[Trajectory] = queue.Queue()
        for index in range(request.group_size):
            threading.Thread(target=lambda i=index: finished.put(
                self.run_episode(request, i, abort, deadline)), daemon=True,
                name=f"agent:{request.group_id}:{index}").start()
        try:
            for _ in range(request.group_size):
                yield finished.get()
        finally:
            abort.set()  # the consumer left early: stop the rest

    def run_episode(self, request: GroupRequest, index: int,
                    abort: threading.Event | None = None,
                    deadline: float | None = None) -> Trajectory:
        """One sample of the group: a full episode, never raising (failures become terminations)."""
        episode = _Episode(self, request, index, abort or threading.Event(), deadline)
        return episode.run()


class _Episode:
    """The state of one episode; `run` is the loop from the module docstring."""

    def __init__(self, loop: AgentLoop, request: GroupRequest, index: int,
                 abort: threading.Event, deadline: float | None):
        self.loop, self.request, self.abort, self.deadline = loop, request, abort, deadline
        self.cfg = loop.config
        self.spec, self.task = request.env, request.task
        self.budgets = request.env.budgets
        self.trajectory_id = f"{request.group_id}:{request.attempt}:{index}"
        self.seed = derive_seed(loop.seed, request.sampling.seed, request.group_id,
                                request.attempt, index)
        self.sampling = apply_overrides(request.sampling, request.env.sampling)
        self.turns: list[Turn] = []
        self.context: list[int] = []
        self.timings = {"generate_s": 0.0, "tools_s": 0.0, "verify_s": 0.0}
        self.env: Env | None = None
        self.answer: str | None = None
        self.tool_cost = 0.0
        self.violations: list = []
        self.invalid_streak = 0
        self.last_call: tuple[str, str] | None = None
        self.repeats = 0

    def run(self) -> Trajectory:
        start = time.monotonic()
        prompt: tuple[int, ...] = ()
        infra = InfraErrorClass.NONE
        components: dict[str, float] = {}
        reward = true_metric = 0.0
        try:
            self.env = self._env_call(lambda: self.loop.open_env(self.spec, self.task), "open")
            user = self._env_call(self.env.reset, "reset")
            tools = list(self._env_call(self.env.tools, "tools"))
            system = chat.system_message(self.cfg.system_prompt, tools, self.cfg.tool_schema)
            prompt = chat.prompt_tokens(self.loop.tokenizer, system, user)
            self.context = list(prompt)
            termination = self._loop({t.name for t in tools})
            verify_start = time.monotonic()
            outcome = call_with_deadline(lambda: self.env.outcome(self.answer),
                                         self.cfg.env_call_timeout_s,
                                         InfraErrorClass.VERIFIER_TIMEOUT, "env.outcome")
            model_score = self._reward_model_score(prompt, termination)
            self.timings["verify_s"] = time.monotonic() - verify_start
            components = {k: float(v) for k, v in outcome.reward_components.items()}
            if model_score is not None:
                components["reward_model"] = model_score
            components.setdefault("tool_cost", self.tool_cost)
            components.setdefault("safety", float(len(self.violations)))
            reward = combine_reward(components, self.spec.reward)
            true_metric = float(outcome.true_metric)
        except _Stop as stop:
            termination, infra = stop.termination, stop.infra
        except EnvInfraError as e:
            logger.warning("episode %s: infra error %s", self.trajectory_id, e)
            termination, infra = Termination.INFRA_ERROR, e.error_class
        except Exception:  # noqa: BLE001 - a bug in one env must not sink the group; counted
            logger.exception("episode %s: unexpected env failure", self.trajectory_id)
            termination, infra = Termination.INFRA_ERROR, InfraErrorClass.SANDBOX_CRASH
        finally:
            self._close_env()
        return Trajectory(
            trajectory_id=self.trajectory_id, task_id=self.task.task_id,
            env_name=self.spec.name, group_id=self.request.group_id,
            attempt=self.request.attempt, prompt_ids=prompt, turns=tuple(self.turns),
            termination=termination, reward_components=components, reward=reward,
            true_metric=true_metric, safety_violations=tuple(self.violations),
            infra_error=infra, split=self.task.split,
            timings=Timings(total_s=time.monotonic() - start, **self.timings))

    def _reward_model_score(self, prompt: tuple[int, ...], termination: Termination
                            ) -> float | None:
        """The learned reward model's score of the finished trajectory; None without one.
        Raises EnvInfraError (the scorer's deadline and crash handling) on failure."""
        folder = self.spec.args.get("reward_model")
        if not folder:
            return None
        timeout_s = float(self.spec.args.get("reward_model_timeout_s", 30.0))
        scored = Trajectory(
            trajectory_id=self.trajectory_id, task_id=self.task.task_id,
            env_name=self.spec.name, group_id=self.request.group_id,
            attempt=self.request.attempt, prompt_ids=prompt, turns=tuple(self.turns),
            termination=termination, reward_components={}, reward=0.0, true_metric=0.0)
        return self.loop.reward_model(str(folder), timeout_s).score(token_stream(scored).tokens)

    def _loop(self, tool_names: set[str]) -> Termination:
        limit = self.budgets.max_total_tokens
        max_context = self.loop.max_context or getattr(self.loop.engine, "max_context", None)
        if max_context is not None:
            limit = min(limit, max_context)
        for turn_index in range(self.budgets.max_turns):
            self._check_abort()
            room = limit - len(self.context)
            if room <= 0:
                return Termination.MAX_TOKENS
            gen = self._generate(turn_index, min(room, self.budgets.max_new_tokens_per_turn,
                                                 self.sampling.max_new_tokens))
            self.turns.append(PolicyTurn(gen.token_ids, gen.logprobs, gen.versions,
                                         gen.finish_reason))
            self.context.extend(gen.token_ids)
            if gen.finish_reason is FinishReason.ABORT:
                raise _Stop(Termination.ABORTED, _ABORTED_CLASS)
            text = self.loop.tokenizer.decode(gen.token_ids)
            parsed = parse_tool_call(text, tool_names)
            if parsed is None and not self.cfg.plain_reply_is_answer:
                parsed = "no tool call found; call a tool"
            if parsed is None:  # a plain reply is the final answer
                self.answer = self.loop.tokenizer.decode(gen.token_ids,
                                                         skip_special_tokens=True).strip()
                return Termination.DONE
            last_turn = turn_index == self.budgets.max_turns - 1
            if isinstance(parsed, str):
                ended = self._invalid(parsed, gen.token_ids, last_turn, limit)
            else:
                ended = self._tool(parsed, gen.token_ids, last_turn, limit)
            if ended is not None:
                return ended
        return Termination.MAX_TURNS

    def _invalid(self, error: str, policy_ids, last_turn: bool, limit: int) -> Termination | None:
        self.invalid_streak += 1
        ended = None
        if self.invalid_streak >= self.cfg.max_consecutive_invalid:
            ended = Termination.INVALID_LOOP
        return self._append_env_turn(EnvTurn((), invalid_call=error), f"error: {error}",
                                     policy_ids, ended, last_turn, limit)

    def _tool(self, call: ToolCall, policy_ids, last_turn: bool, limit: int) -> Termination | None:
        self.invalid_streak = 0
        tool_start = time.monotonic()
        step = self._env_call(lambda: self.env.step(call), f"step {call.name}")
        self.timings["tools_s"] += time.monotonic() - tool_start
        self.tool_cost += step.result.cost
        self.violations.extend(step.safety_violations)
        signature = (call.name, json.dumps(call.arguments, sort_keys=True, default=str),
                     step.observation)
        self.repeats = self.repeats + 1 if signature == self.last_call else 1
        self.last_call = signature
        ended = None
        if step.done:
            ended = Termination.DONE
        elif step.safety_violations and self.spec.safety.stop_on_violation:
            ended = Termination.SAFETY_STOP
        elif self.tool_cost > self.budgets.max_tool_cost:
            ended = Termination.MAX_TOOL_COST
        elif self.repeats >= self.cfg.max_repeated_calls:
            ended = Termination.INVALID_LOOP
        turn = EnvTurn((), tool_call=call, result=step.result, side_effects=step.side_effects,
                       verdict=step.verdict)
        return self._append_env_turn(turn, step.observation, policy_ids, ended, last_turn, limit)

    def _append_env_turn(self, turn: EnvTurn, observation: str, policy_ids,
                         ended: Termination | None, last_turn: bool, limit: int
                         ) -> Termination | None:
        """Insert the observation unless the episode ends here (then nothing would follow it)."""
        ids: tuple[int, ...] = ()
        if ended is None and not last_turn:
            ids = chat.observation_tokens(self.loop.tokenizer, observation, policy_ids)
            if len(self.context) + len(ids) >= limit:
                ended, ids = Termination.MAX_TOKENS, ()
        self.turns.append(dataclasses.replace(turn, token_ids=ids))
        self.context.extend(ids)
        return ended

    def _generate(self, turn_index: int, max_new: int) -> Generation:
        sampling = dataclasses.replace(
            self.sampling, max_new_tokens=max_new,
            stop_token_ids=tuple(sorted(set(self.sampling.stop_token_ids)
                                        | set(chat.turn_stop_ids(self.loop.tokenizer)))),
            seed=derive_seed(self.seed, turn_index))
        request = GenerationRequest(f"{self.trajectory_id}:{turn_index}", tuple(self.context),
                                    sampling, session_id=self.trajectory_id)
        start = time.monotonic()
        try:
            return self._wait(request)
        except EngineError as e:
            logger.warning("episode %s: engine error %s", self.trajectory_id, e)
            raise _Stop(Termination.INFRA_ERROR, InfraErrorClass.ENGINE_ERROR) from e
        finally:
            self.timings["generate_s"] += time.monotonic() - start

    def _wait(self, request: GenerationRequest) -> Generation:
        """Wait for the turn, aborting it on the group's abort/deadline or the turn deadline."""
        engine = self.loop.engine
        submit = getattr(engine, "submit", None)
        if submit is None:  # engines without futures: one blocking call on a helper thread
            return call_with_deadline(lambda: engine.generate([request])[0],
                                      self.cfg.generate_timeout_s,
                                      InfraErrorClass.ENGINE_ERROR, "engine.generate")
        future = submit(request)
        turn_deadline = time.monotonic() + self.cfg.generate_timeout_s
        while True:
            try:
                return future.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                pass
            if self._aborted() or time.monotonic() > turn_deadline:
                abort = getattr(engine, "abort", None)
                if abort is not None:
                    abort([request.request_id])
                try:
                    result = future.result(timeout=5.0)
                except concurrent.futures.TimeoutError as e:
                    raise EngineError(f"{request.request_id} did not stop after abort") from e
                if not self._aborted():
                    raise EngineError(f"{request.request_id} missed generate_timeout_s="
                                      f"{self.cfg.generate_timeout_s}")
                return result

    def _aborted(self) -> bool:
        return self.abort.is_set() or (self.deadline is not None
                                       and time.monotonic() > self.deadline)

    def _check_abort(self) -> None:
        if self._aborted():
            raise _Stop(Termination.ABORTED, _ABORTED_CLASS)

    def _env_call(self, fn: Callable[[], Any], what: str) -> Any:
        return call_with_deadline(fn, self.cfg.env_call_timeout_s, InfraErrorClass.ENV_TIMEOUT,
                                  f"env {what}")

    def _close_env(self) -> None:
        release = getattr(self.loop.engine, "release_session", None)
        if release is not None:
            release(self.trajectory_id)
        if self.env is None:
            return
        try:
            call_with_deadline(self.env.close, self.cfg.env_call_timeout_s,
                               InfraErrorClass.ENV_TIMEOUT, "env close")
        except Exception:  # noqa: BLE001 - the episode is already scored; log and move on
            logger.exception("episode %s: env close failed", self.trajectory_id)
