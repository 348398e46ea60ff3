"""Validation of everything a client can send about an environment: `EnvSpec`, `Task`, tools.

Clients are outside the trust boundary, so every field is checked once, here, before the
registry accepts a spec; the rest of the code trusts a validated spec. Every error is a
`SpecError` that names the field (a dotted path), the rule, and the value seen, e.g.

    EnvSpec.budgets.max_turns: must be between 1 and 64, got 0

This module checks shape and ranges only. It does not contact a remote `EnvService`
(reachability is checked when the env is first used) and does not run any task.

Paths: a spec names no file on the host. The only paths a client may send are workspace-relative
ones (`safety.protected_paths`, the starting files of a `files` task), and each must be relative,
without `..` and without NUL; the env resolves them inside the workspace again (symlinks
included) before touching anything. Sizes: the serialised spec, the task count (explicit tasks
and `args.num_tasks` of generated ones), each prompt and each JSON field are capped (`SpecLimits`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Iterable

from sandbox import api

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
ADDRESS_PATTERN = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}$")
SPLITS = ("train", "eval")


class SpecError(ValueError):
    """A client-supplied spec broke a rule. `field`, `rule` and `value` say which and how."""

    def __init__(self, field: str, rule: str, value: Any):
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        super().__init__(f"{field}: {rule}, got {shown}")
        self.field = field
        self.rule = rule
        self.value = value


@dataclasses.dataclass(frozen=True)
class SpecLimits:
    """Caps on what one client may submit. Raising them costs controller memory and checkpoint size."""

    max_spec_bytes: int = 4 << 20  # serialised EnvSpec message
    max_tasks: int = 20_000  # explicit tasks in one spec
    max_prompt_chars: int = 16_384  # one task's prompt
    max_json_bytes: int = 64 << 10  # args, verifier, metadata, tool parameters (as JSON)
    max_tools: int = 32
    max_turns: int = 64
    max_new_tokens_per_turn: int = 8_192
    max_total_tokens: int = 131_072
    max_tool_timeout_s: float = 600.0
    max_mixture_weight: float = 1e6


def validate_env_spec(
    spec: api.EnvSpec,
    known_kinds: Iterable[str] | None = None,
    limits: SpecLimits = SpecLimits(),
) -> api.EnvSpec:
    """Return `spec` unchanged if it is valid; raise `SpecError` on the first broken rule."""
    if known_kinds is None:
        from sandbox.envs import KINDS

        known_kinds = KINDS
    kinds = sorted(set(known_kinds) | {"remote"})
    f = "EnvSpec"
    _require(isinstance(spec.name, str) and NAME_PATTERN.match(spec.name), f"{f}.name",
             "must match [a-z0-9][a-z0-9_.-]{0,63}", spec.name)
    _require(isinstance(spec.kind, str) and spec.kind in kinds, f"{f}.kind", f"must be one of {kinds}", spec.kind)
    if spec.kind == "remote":
        _require(isinstance(spec.remote_address, str) and ADDRESS_PATTERN.match(spec.remote_address),
                 f"{f}.remote_address",
                 "must be host:port when kind is 'remote'", spec.remote_address)
        port = int(spec.remote_address.rsplit(":", 1)[1])
        _require(0 < port < 65536, f"{f}.remote_address", "port must be between 1 and 65535", spec.remote_address)
    else:
        _require(not spec.remote_address, f"{f}.remote_address", "must be empty unless kind is 'remote'",
                 spec.remote_address)
    _require(isinstance(spec.args, dict), f"{f}.args", "must be a mapping", spec.args)
    check_json(spec.args, f"{f}.args", limits)
    if "num_tasks" in spec.args:  # generated tasks are held in memory too
        _check_int(spec.args["num_tasks"], f"{f}.args.num_tasks", 1, limits.max_tasks)

    _require(len(spec.tasks) <= limits.max_tasks, f"{f}.tasks", f"at most {limits.max_tasks} tasks", len(spec.tasks))
    seen: set[str] = set()
    for i, task in enumerate(spec.tasks):
        validate_task(task, f"{f}.tasks[{i}]", limits, kind=spec.kind)
        _require(task.task_id not in seen, f"{f}.tasks[{i}].task_id", "must be unique within the env", task.task_id)
        seen.add(task.task_id)

    _require(len(spec.tools) <= limits.max_tools, f"{f}.tools", f"at most {limits.max_tools} tools", len(spec.tools))
    names: set[str] = set()
    for i, tool in enumerate(spec.tools):
        g = f"{f}.tools[{i}]"
        _require(isinstance(tool.name, str) and re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$", tool.name), f"{g}.name",
                 "must be an identifier of at most 64 characters", tool.name)
        _require(tool.name not in names, f"{g}.name", "must be unique within the env", tool.name)
        names.add(tool.name)
        _check_number(tool.cost_per_call, f"{g}.cost_per_call", 0.0, 1e9)
        _check_number(tool.cost_per_second, f"{g}.cost_per_second", 0.0, 1e9)
        check_json(tool.parameters, f"{g}.parameters", limits)

    b, g = spec.budgets, f"{f}.budgets"
    _check_int(b.max_turns, f"{g}.max_turns", 1, limits.max_turns)
    _check_int(b.max_new_tokens_per_turn, f"{g}.max_new_tokens_per_turn", 1, limits.max_new_tokens_per_turn)
    _check_int(b.max_total_tokens, f"{g}.max_total_tokens", 16, limits.max_total_tokens)
    _require(b.max_total_tokens >= b.max_new_tokens_per_turn, f"{g}.max_total_tokens",
             f"must be at least max_new_tokens_per_turn ({b.max_new_tokens_per_turn})", b.max_total_tokens)
    _check_number(b.max_tool_cost, f"{g}.max_tool_cost", 0.0, 1e12)
    _check_number(b.tool_timeout_s, f"{g}.tool_timeout_s", 1e-3, limits.max_tool_timeout_s)

    for name in ("outcome", "process", "format", "reward_model"):
        _check_number(getattr(spec.reward, name), f"{f}.reward.{name}", -1e6, 1e6)
    for name in ("tool_cost", "safety"):
        _check_number(getattr(spec.reward, name), f"{f}.reward.{name}", 0.0, 1e6)

    for i, path in enumerate(spec.safety.protected_paths):
        p = f"{f}.safety.protected_paths[{i}]"
        check_workspace_path(path, p)

    s = spec.sampling
    if s.temperature is not None:
        _check_number(s.temperature, f"{f}.sampling.temperature", 0.0, 10.0)
    if s.top_p is not None:
        _check_number(s.top_p, f"{f}.sampling.top_p", 1e-6, 1.0)
    if s.top_k is not None:
        _check_int(s.top_k, f"{f}.sampling.top_k", 0, 1 << 20)

    _check_number(spec.mixture_weight, f"{f}.mixture_weight", 1e-9, limits.max_mixture_weight)
    _require(_is_number(spec.eval_fraction) and 0.0 <= spec.eval_fraction < 1.0, f"{f}.eval_fraction",
             "must be in [0, 1)", spec.eval_fraction)
    return spec


def validate_task(task: api.Task, field: str = "Task", limits: SpecLimits = SpecLimits(),
                  kind: str | None = None) -> api.Task:
    """Return `task` unchanged if it is valid; raise `SpecError` otherwise. With `kind`, also the
    kind's own rules (the `files` env's starting files must be workspace-relative paths)."""
    _require(isinstance(task.task_id, str) and 0 < len(task.task_id) <= 128, f"{field}.task_id",
             "must be non-empty and at most 128 characters", task.task_id)
    _require(isinstance(task.prompt, str), f"{field}.prompt", "must be text", task.prompt)
    _require(task.prompt, f"{field}.prompt", "must be non-empty", task.prompt)
    _require(len(task.prompt) <= limits.max_prompt_chars, f"{field}.prompt",
             f"must be at most {limits.max_prompt_chars} characters", f"<{len(task.prompt)} characters>")
    _require(isinstance(task.split, str) and task.split in SPLITS, f"{field}.split", f"must be one of {list(SPLITS)}", task.split)
    check_json(task.verifier, f"{field}.verifier", limits)
    check_json(task.metadata, f"{field}.metadata", limits)
    if kind == "files":
        files = task.verifier.get("files") if isinstance(task.verifier, dict) else None
        _require(isinstance(files, dict), f"{field}.verifier.files",
                 "must be a mapping of workspace-relative path to text (files env)", files)
        for path, content in files.items():
            check_workspace_path(path, f"{field}.verifier.files[{path!r}]"[:200])
            _require(isinstance(content, str), f"{field}.verifier.files[{path!r}]"[:200], "must be text", content)
    return task


def check_workspace_path(path: Any, field: str) -> str:
    """`path` if it is a relative path that stays inside a workspace, else SpecError."""
    ok = (isinstance(path, str) and 0 < len(path) <= 1024 and "\x00" not in path and not path.startswith("/")
          and ".." not in path.replace("\\", "/").split("/"))
    _require(ok, field, "must be a relative path inside the workspace", path)  # no '/' start, '..', NUL; <= 1024 chars
    return path


def check_message_size(size_bytes: int, limits: SpecLimits = SpecLimits()) -> None:
    """Reject an oversized serialised EnvSpec before converting it."""
    _require(size_bytes <= limits.max_spec_bytes, "EnvSpec", f"serialised size must be at most "
             f"{limits.max_spec_bytes} bytes", size_bytes)


def _require(ok: Any, field: str, rule: str, value: Any) -> None:
    if not ok:
        raise SpecError(field, rule, value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_number(value: Any, field: str, low: float, high: float) -> None:
    ok = _is_number(value)
    _require(ok and low <= value <= high, field, f"must be a finite number between {low:g} and {high:g}", value)


def _check_int(value: Any, field: str, low: int, high: int) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool)
    _require(ok and low <= value <= high, field, f"must be an integer between {low} and {high}", value)


def check_json(value: Any, field: str, limits: SpecLimits = SpecLimits()) -> None:
    """SpecError unless `value` is plain JSON of at most `limits.max_json_bytes`."""
    try:
        size = len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise SpecError(field, f"must be plain JSON ({error})", value) from None
    _require(size <= limits.max_json_bytes, field, f"must be at most {limits.max_json_bytes} bytes as JSON",
             f"<{size} bytes>")
