"""`BuiltinEnv`: the episode mechanics every built-in environment shares.

A subclass names its default tools, whether it needs a workspace, and implements `score()`
(and optionally `setup_workspace()` and `process_verdict()`). This class does the rest, in one
place: tool dispatch, per-call costs, side effects (a snapshot before and after each step that
can change files), safety checks, stopping on violations, and the reward components:

    outcome   the env's own verdict on the answer (subclass `score()`), in [0, 1]
    format    1.0 when the agent submitted through the `answer` tool
    process   mean process-verifier score over the steps that got one (absent if none did)
    tool_cost summed tool cost (positive; `combine_reward` subtracts it)
    safety    number of safety violations (positive; `combine_reward` subtracts it)

Components are unweighted; the rollout side combines them with `sandbox.api.combine_reward`.
An agent's mistakes (unknown tool, bad arguments, failing program) come back as a StepResult with
an error; only infrastructure failures raise EnvInfraError.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import random
import time
from pathlib import Path
from typing import Sequence

from sandbox import safety, sideeffects, tools
from sandbox.api import (EnvInfraError, EnvSpec, FileChange, InfraErrorClass, Outcome, ProcessVerdict,
                         SafetyViolation, StepResult, Task, ToolCall, ToolResult, ToolSpec)
from sandbox.config import SandboxConfig

log = logging.getLogger(__name__)

# File-tool errors the agent's arguments cause (missing file, link, directory, ...), not the host.
_AGENT_ERRNOS = {errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.EEXIST, errno.EACCES,
                 errno.EPERM, errno.ENAMETOOLONG, errno.EFBIG, errno.EINVAL}


@dataclasses.dataclass(frozen=True)
class Score:
    """A subclass's verdict on the final answer."""

    outcome: float  # reward component "outcome", in [0, 1]
    true_metric: float  # held-out success, never trained on
    verified: bool


def assign_splits(tasks: list[Task], eval_fraction: float, seed: str) -> list[Task]:
    """Mark round(len * eval_fraction) tasks, chosen by `seed`, as "eval"; the rest stay "train"."""
    n_eval = round(len(tasks) * eval_fraction)
    chosen = set(random.Random(f"split/{seed}").sample(range(len(tasks)), n_eval))
    return [dataclasses.replace(t, split="eval" if i in chosen else "train") for i, t in enumerate(tasks)]


def format_observation(result: ToolResult) -> str:
    """The text the agent sees for a program's result: stdout, stderr, and how it ended."""
    parts = [result.output.rstrip("\n")] if result.output else []
    if result.error:
        parts.append(result.error.rstrip("\n"))
    if result.killed_by:
        parts.append(f"[killed: {result.killed_by} limit]")
    elif result.exit_status:
        parts.append(f"[exit status {result.exit_status}]")
    return "\n".join(parts)


class BuiltinEnv:
    """One episode of one task of a built-in kind. Implements `sandbox.api.Env`."""

    KIND = ""
    DEFAULT_TOOLS: tuple[str, ...] = ()
    NEEDS_WORKSPACE = True  # lease a sandbox at reset (False: pure-Python tools only)
    MAX_READ_BYTES = 16 << 10  # read_file returns at most this much

    def __init__(self, spec: EnvSpec, task: Task, config: SandboxConfig | None = None, pool=None):
        self.spec = spec
        self.task = task
        self.config = config or SandboxConfig()
        self._tools: tuple[ToolSpec, ...] = tuple(spec.tools) or tools.default_tools(self.DEFAULT_TOOLS)
        self._tool_by_name = {t.name: t for t in self._tools}
        self._pool = pool
        self.policy = spec.safety  # subclasses may add task-specific protected paths
        self.sandbox = None
        self._snapshot: sideeffects.Snapshot | None = None
        self.answer: str | None = None
        self.answered_via_tool = False
        self.total_cost = 0.0
        self.violations: list[SafetyViolation] = []
        self.verdicts: list[ProcessVerdict] = []
        self.done = False

    # --- the Env protocol ---------------------------------------------------------------------

    def reset(self) -> str:
        if self.NEEDS_WORKSPACE and self.sandbox is None:
            if self._pool is None:
                from sandbox.pool import get_pool  # deferred: pure-Python envs never build a pool
                self._pool = get_pool(self.config)
            self.sandbox = self._pool.acquire()
            self.setup_workspace(self.sandbox.workspace)
            self._snapshot = sideeffects.snapshot(self.sandbox.workspace)
        return self.task.prompt

    def tools(self) -> Sequence[ToolSpec]:
        return self._tools

    def step(self, call: ToolCall) -> StepResult:
        if self.done:
            return self._error("the episode is over", done=True)
        spec = self._tool_by_name.get(call.name)
        if spec is None:
            return self._error(f"unknown tool {call.name!r}; available: {sorted(self._tool_by_name)}")
        started = time.monotonic()
        outside = False
        try:
            observation, result = self._dispatch(call)
        except tools.OutsideWorkspaceError as e:
            outside = True
            observation, result = f"error: {e}", ToolResult(error=str(e), exit_status=1)
        except (ValueError, TypeError, KeyError) as e:  # the agent's bad arguments
            observation, result = f"error: {e}", ToolResult(error=str(e), exit_status=1)
        except OSError as e:
            if e.errno not in _AGENT_ERRNOS:
                raise EnvInfraError(InfraErrorClass.SANDBOX_CRASH, f"{call.name}: {e}") from e
            observation, result = f"error: {e}", ToolResult(error=str(e), exit_status=1)
        duration = result.duration_s or (time.monotonic() - started)
        cost = spec.cost_per_call + spec.cost_per_second * duration
        result = dataclasses.replace(result, duration_s=duration, cost=cost)
        self.total_cost += cost
        changes = self._side_effects() if call.name not in ("calculator", "answer", "read_file", "list_files") else ()
        found = safety.check_step(self.policy, call, result, changes, outside)
        self.violations.extend(found)
        verdict = self.process_verdict(call, result, changes)
        if verdict is not None:
            self.verdicts.append(verdict)
        stop = bool(found) and self.policy.stop_on_violation
        self.done = self.done or stop
        return StepResult(observation, result, changes, verdict, found, self.done)

    def outcome(self, answer: str | None) -> Outcome:
        if answer is None:
            answer = self.answer
        score = self.score(answer)
        components = {
            "outcome": score.outcome,
            "format": 1.0 if self.answered_via_tool else 0.0,
            "tool_cost": self.total_cost,
            "safety": float(len(self.violations)),
        }
        if self.verdicts:
            components["process"] = sum(v.score for v in self.verdicts) / len(self.verdicts)
        return Outcome(components, score.true_metric, score.verified)

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.release()
            self.sandbox = None

    # --- for subclasses -----------------------------------------------------------------------

    def setup_workspace(self, workspace: Path) -> None:
        """Create the task's starting files."""

    def score(self, answer: str | None) -> Score:
        raise NotImplementedError

    def process_verdict(self, call: ToolCall, result: ToolResult,
                        changes: tuple[FileChange, ...]) -> ProcessVerdict | None:
        """Judge one step (None: this env has no process verifier)."""
        return None

    # --- internals ----------------------------------------------------------------------------

    def _error(self, message: str, done: bool = False) -> StepResult:
        return StepResult(f"error: {message}", ToolResult(error=message, exit_status=1), done=done or self.done)

    def _workspace(self) -> Path:
        if self.sandbox is None:
            raise EnvInfraError(InfraErrorClass.SANDBOX_CRASH, f"{self.KIND}: no workspace (reset() not called?)")
        return self.sandbox.workspace

    def _side_effects(self) -> tuple[FileChange, ...]:
        if self.sandbox is None:
            return ()
        after = sideeffects.snapshot(self.sandbox.workspace, self._snapshot)
        changes = sideeffects.diff(self._snapshot or {}, after)
        self._snapshot = after
        return changes

    def _dispatch(self, call: ToolCall) -> tuple[str, ToolResult]:
        args = call.arguments
        name = call.name
        if name == "answer":
            self.answer = str(args.get("answer", ""))
            self.answered_via_tool = True
            self.done = True
            return "submitted", ToolResult(output="submitted")
        if name == "calculator":
            try:
                value = tools.calculate(args["expression"])
            except tools.CalculatorError as e:
                return f"error: {e}", ToolResult(error=str(e), exit_status=1)
            return value, ToolResult(output=value)
        if name in ("python", "shell"):
            self._workspace()
            wall_s = self.spec.budgets.tool_timeout_s
            if name == "python":
                ran = self.sandbox.run_python(str(args["code"]), wall_s)
            else:
                ran = self.sandbox.run_shell(str(args["command"]), wall_s)
            result = ran.tool_result()
            return format_observation(result), result
        if name == "read_file":
            text = tools.read_file(self._workspace(), str(args["path"]), self.MAX_READ_BYTES)
            return text, ToolResult(output=text)
        if name == "write_file":
            message = tools.write_file(self._workspace(), str(args["path"]), str(args["content"]),
                                       self.config.file_size_bytes, self.sandbox.uid)
            return message, ToolResult(output=message)
        if name == "list_files":
            listing = tools.list_files(self._workspace(), str(args.get("path", ".")))
            return listing, ToolResult(output=listing)
        raise ValueError(f"tool {name!r} has no implementation in env kind {self.KIND!r}")
