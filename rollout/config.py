"""Configuration of a rollout worker: the embedded JAX engine and the agent loop around it.

Frozen dataclasses, one per concern, each field with its unit and effect. Fields marked
"(recompiles)" change the shapes the JAX engine compiles for; every other field is free to
change between runs without recompiling. Validation happens at construction and names the
field, the rule and the value seen. The SGLang engine's knobs live in `rollout/sglang.py`
(`SGLangConfig`), never here.
"""

from __future__ import annotations

import dataclasses

ENGINES = ("jax", "sglang", "fake")
DTYPES = ("float32", "bfloat16")


def _positive_int(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


def _positive_float(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{owner}.{name} must be a positive number, got {value!r}")


@dataclasses.dataclass(frozen=True)
class JaxEngineConfig:
    """The embedded JAX sampler (`rollout/engine_jax.py`)."""

    slots: int = 8
    """Sequences decoded together (the decode batch); each owns one KV-cache row (recompiles)."""
    max_seq_len: int = 1024
    """KV-cache length per slot in tokens: prompt + all output of one sequence (recompiles).
    Decode attends over a power-of-two prefix (>= 128) covering the longest active row, so a
    large value costs memory, not per-step time; prefill still reads whole rows."""
    prefill_buckets: tuple[int, ...] = (64, 256)
    """Prefill chunk lengths in tokens, ascending; a prompt is padded to the next bucket and
    prompts longer than the last are prefilled in chunks of it (one compile per bucket)."""
    decode_steps_per_call: int = 4
    """Decode steps fused into one compiled call (lax.scan); larger amortises dispatch, but a
    freed slot waits up to this many steps to be refilled (recompiles)."""
    fold_prefill_tokens: int = 16
    """A request with at most this many unfed tokens (a turn continuation, a prompt sharing a
    cached prefix) feeds them through decode steps, riding along rows the step computes anyway,
    instead of a separate prefill call; more go through prefill. 1 disables folding."""
    max_stop_ids: int = 8
    """Most stop token ids one request may carry (recompiles)."""
    session_hold_s: float = 0.5
    """After a session's turn ends, its slot (and KV cache) waits this long for the session's
    next turn before a new request may evict it; tool calls slower than this cost a re-prefill."""
    continuation_grace_s: float = 0.002
    """Before the next decode call, wait up to this long for sessions whose turn just ended to
    send their next turn (so their rows join the call instead of idling through it); 0: never."""
    interrupt_on_update: bool = False
    """False: a weight update waits for in-flight requests to finish on their version (drain).
    True: the switch happens between decode calls and in-flight requests continue on the new
    weights (their context is re-prefilled), so one turn may carry two versions."""
    dtype: str = "float32"
    """Compute, KV-cache and served-parameter dtype: 'float32' or 'bfloat16' (recompiles)."""
    update_timeout_s: float = 600.0
    """Longest a weight update waits for the scheduler to switch before raising."""

    def __post_init__(self) -> None:
        owner = "JaxEngineConfig"
        for name in ("slots", "max_seq_len", "decode_steps_per_call", "fold_prefill_tokens",
                     "max_stop_ids"):
            _positive_int(owner, name, getattr(self, name))
        buckets = tuple(self.prefill_buckets)
        if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0
                              for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(f"{owner}.prefill_buckets must be positive ints, strictly "
                             f"ascending, got {self.prefill_buckets!r}")
        if buckets[-1] > self.max_seq_len:
            raise ValueError(f"{owner}.prefill_buckets must not exceed max_seq_len="
                             f"{self.max_seq_len}, got {buckets!r}")
        object.__setattr__(self, "prefill_buckets", buckets)
        if self.dtype not in DTYPES:
            raise ValueError(f"{owner}.dtype must be one of {DTYPES}, got {self.dtype!r}")
        _positive_float(owner, "update_timeout_s", self.update_timeout_s)
        for name in ("session_hold_s", "continuation_grace_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{owner}.{name} must be a number >= 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """The multi-turn agent loop (`rollout/agent.py`). Budgets come from the env's EnvSpec."""

    max_consecutive_invalid: int = 3
    """Malformed tool calls in a row that end the episode as INVALID_LOOP."""
    max_repeated_calls: int = 3
    """The same call (name and arguments) with the same observation this many times in a row
    ends the episode as INVALID_LOOP (no progress)."""
    plain_reply_is_answer: bool = True
    """A policy turn without any <tool_call> ends the episode and its text is the answer (chat
    semantics); False treats it as a malformed call (an error observation, counted)."""
    env_call_timeout_s: float = 30.0
    """Deadline of every env call (reset, step, outcome); a miss is an ENV_TIMEOUT infra error."""
    generate_timeout_s: float = 300.0
    """Deadline of one policy turn on the engine; a miss is an ENGINE_ERROR infra error."""
    tool_schema: str = "compact"
    """How tools are listed in the system prompt: 'compact' (one line per tool: name and
    argument names) or 'json' (full OpenAI function JSON, one per line)."""
    system_prompt: str = "Solve the task with tools."
    """First line of the system message; the tool list and call format follow it (keep it
    short: every prompt token is prefilled for every sample)."""

    def __post_init__(self) -> None:
        owner = "AgentConfig"
        _positive_int(owner, "max_consecutive_invalid", self.max_consecutive_invalid)
        _positive_int(owner, "max_repeated_calls", self.max_repeated_calls)
        _positive_float(owner, "env_call_timeout_s", self.env_call_timeout_s)
        _positive_float(owner, "generate_timeout_s", self.generate_timeout_s)
        if self.tool_schema not in ("compact", "json"):
            raise ValueError(f"{owner}.tool_schema must be one of ('compact', 'json'), "
                             f"got {self.tool_schema!r}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """One rollout worker process (`python -m rollout.server`)."""

    engine: str = "jax"
    """Which engine serves the worker: 'jax' (embedded), 'sglang' (a server beside it) or 'fake'."""
    worker_id: str = "rollout-0"
    """Name reported in WorkerInfo and WeightAck."""
    jax: JaxEngineConfig = JaxEngineConfig()
    """Settings of the embedded JAX engine (used when engine == 'jax')."""
    agent: AgentConfig = AgentConfig()
    """Settings of the agent loop."""
    max_concurrent_groups: int = 8
    """Groups served at once; further RolloutGroup calls are refused with RESOURCE_EXHAUSTED."""
    group_deadline_s: float = 1800.0
    """Server-side cap on one RolloutGroup call; unfinished samples end as ABORTED infra errors."""
    shutdown_grace_s: float = 5.0
    """Seconds in-flight calls get to finish when the server stops."""

    def __post_init__(self) -> None:
        owner = "RolloutConfig"
        if self.engine not in ENGINES:
            raise ValueError(f"{owner}.engine must be one of {ENGINES}, got {self.engine!r}")
        if not self.worker_id:
            raise ValueError(f"{owner}.worker_id must be non-empty, got {self.worker_id!r}")
        _positive_int(owner, "max_concurrent_groups", self.max_concurrent_groups)
        _positive_float(owner, "group_deadline_s", self.group_deadline_s)
        _positive_float(owner, "shutdown_grace_s", self.shutdown_grace_s)
