from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolSpec(_message.Message):
    __slots__ = ("name", "description", "parameters", "cost_per_call", "cost_per_second")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    COST_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    COST_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: _struct_pb2.Struct
    cost_per_call: float
    cost_per_second: float
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., cost_per_call: _Optional[float] = ..., cost_per_second: _Optional[float] = ...) -> None: ...

class Budgets(_message.Message):
    __slots__ = ("max_turns", "max_new_tokens_per_turn", "max_total_tokens", "max_tool_cost", "tool_timeout_s")
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_PER_TURN_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_COST_FIELD_NUMBER: _ClassVar[int]
    TOOL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    max_turns: int
    max_new_tokens_per_turn: int
    max_total_tokens: int
    max_tool_cost: float
    tool_timeout_s: float
    def __init__(self, max_turns: _Optional[int] = ..., max_new_tokens_per_turn: _Optional[int] = ..., max_total_tokens: _Optional[int] = ..., max_tool_cost: _Optional[float] = ..., tool_timeout_s: _Optional[float] = ...) -> None: ...

class RewardWeights(_message.Message):
    __slots__ = ("outcome", "process", "format", "tool_cost", "safety", "reward_model")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TOOL_COST_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FIELD_NUMBER: _ClassVar[int]
    REWARD_MODEL_FIELD_NUMBER: _ClassVar[int]
    outcome: float
    process: float
    format: float
    tool_cost: float
    safety: float
    reward_model: float
    def __init__(self, outcome: _Optional[float] = ..., process: _Optional[float] = ..., format: _Optional[float] = ..., tool_cost: _Optional[float] = ..., safety: _Optional[float] = ..., reward_model: _Optional[float] = ...) -> None: ...

class SafetyPolicy(_message.Message):
    __slots__ = ("forbid_network", "forbid_outside_workspace", "protected_paths", "stop_on_violation")
    FORBID_NETWORK_FIELD_NUMBER: _ClassVar[int]
    FORBID_OUTSIDE_WORKSPACE_FIELD_NUMBER: _ClassVar[int]
    PROTECTED_PATHS_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_VIOLATION_FIELD_NUMBER: _ClassVar[int]
    forbid_network: bool
    forbid_outside_workspace: bool
    protected_paths: _containers.RepeatedScalarFieldContainer[str]
    stop_on_violation: bool
    def __init__(self, forbid_network: _Optional[bool] = ..., forbid_outside_workspace: _Optional[bool] = ..., protected_paths: _Optional[_Iterable[str]] = ..., stop_on_violation: _Optional[bool] = ...) -> None: ...

class SamplingOverrides(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "prompt", "verifier", "split", "metadata")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    prompt: str
    verifier: _struct_pb2.Struct
    split: str
    metadata: _struct_pb2.Struct
    def __init__(self, task_id: _Optional[str] = ..., prompt: _Optional[str] = ..., verifier: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., split: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class EnvSpec(_message.Message):
    __slots__ = ("name", "kind", "args", "remote_address", "tasks", "tools", "budgets", "reward", "safety", "sampling", "mixture_weight", "eval_fraction")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    REMOTE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MIXTURE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    EVAL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    args: _struct_pb2.Struct
    remote_address: str
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    tools: _containers.RepeatedCompositeFieldContainer[ToolSpec]
    budgets: Budgets
    reward: RewardWeights
    safety: SafetyPolicy
    sampling: SamplingOverrides
    mixture_weight: float
    eval_fraction: float
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., args: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., remote_address: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[ToolSpec, _Mapping]]] = ..., budgets: _Optional[_Union[Budgets, _Mapping]] = ..., reward: _Optional[_Union[RewardWeights, _Mapping]] = ..., safety: _Optional[_Union[SafetyPolicy, _Mapping]] = ..., sampling: _Optional[_Union[SamplingOverrides, _Mapping]] = ..., mixture_weight: _Optional[float] = ..., eval_fraction: _Optional[float] = ...) -> None: ...
