from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileChangeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_CHANGE_KIND_UNSPECIFIED: _ClassVar[FileChangeKind]
    FILE_CHANGE_KIND_CREATED: _ClassVar[FileChangeKind]
    FILE_CHANGE_KIND_MODIFIED: _ClassVar[FileChangeKind]
    FILE_CHANGE_KIND_DELETED: _ClassVar[FileChangeKind]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]

class Termination(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TERMINATION_UNSPECIFIED: _ClassVar[Termination]
    TERMINATION_DONE: _ClassVar[Termination]
    TERMINATION_MAX_TURNS: _ClassVar[Termination]
    TERMINATION_MAX_TOKENS: _ClassVar[Termination]
    TERMINATION_MAX_TOOL_COST: _ClassVar[Termination]
    TERMINATION_INVALID_LOOP: _ClassVar[Termination]
    TERMINATION_SAFETY_STOP: _ClassVar[Termination]
    TERMINATION_INFRA_ERROR: _ClassVar[Termination]
    TERMINATION_ABORTED: _ClassVar[Termination]

class InfraErrorClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INFRA_ERROR_CLASS_UNSPECIFIED: _ClassVar[InfraErrorClass]
    INFRA_ERROR_CLASS_NONE: _ClassVar[InfraErrorClass]
    INFRA_ERROR_CLASS_TOOL_TIMEOUT: _ClassVar[InfraErrorClass]
    INFRA_ERROR_CLASS_SANDBOX_CRASH: _ClassVar[InfraErrorClass]
    INFRA_ERROR_CLASS_ENV_UNREACHABLE: _ClassVar[InfraErrorClass]
    INFRA_ERROR_CLASS_ENV_TIMEOUT: _ClassVar[InfraErrorClass]
    INFRA_ERROR_CLASS_VERIFIER_TIMEOUT: _ClassVar[InfraErrorClass]
    INFRA_ERROR_CLASS_VERIFIER_CRASH: _ClassVar[InfraErrorClass]
    INFRA_ERROR_CLASS_ENGINE_ERROR: _ClassVar[InfraErrorClass]
    INFRA_ERROR_CLASS_WORKER_LOST: _ClassVar[InfraErrorClass]
FILE_CHANGE_KIND_UNSPECIFIED: FileChangeKind
FILE_CHANGE_KIND_CREATED: FileChangeKind
FILE_CHANGE_KIND_MODIFIED: FileChangeKind
FILE_CHANGE_KIND_DELETED: FileChangeKind
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
TERMINATION_UNSPECIFIED: Termination
TERMINATION_DONE: Termination
TERMINATION_MAX_TURNS: Termination
TERMINATION_MAX_TOKENS: Termination
TERMINATION_MAX_TOOL_COST: Termination
TERMINATION_INVALID_LOOP: Termination
TERMINATION_SAFETY_STOP: Termination
TERMINATION_INFRA_ERROR: Termination
TERMINATION_ABORTED: Termination
INFRA_ERROR_CLASS_UNSPECIFIED: InfraErrorClass
INFRA_ERROR_CLASS_NONE: InfraErrorClass
INFRA_ERROR_CLASS_TOOL_TIMEOUT: InfraErrorClass
INFRA_ERROR_CLASS_SANDBOX_CRASH: InfraErrorClass
INFRA_ERROR_CLASS_ENV_UNREACHABLE: InfraErrorClass
INFRA_ERROR_CLASS_ENV_TIMEOUT: InfraErrorClass
INFRA_ERROR_CLASS_VERIFIER_TIMEOUT: InfraErrorClass
INFRA_ERROR_CLASS_VERIFIER_CRASH: InfraErrorClass
INFRA_ERROR_CLASS_ENGINE_ERROR: InfraErrorClass
INFRA_ERROR_CLASS_WORKER_LOST: InfraErrorClass

class ToolCall(_message.Message):
    __slots__ = ("name", "arguments_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments_json: str
    def __init__(self, name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ("output", "error", "exit_status", "duration_s", "cpu_s", "cost", "timed_out", "killed_by")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EXIT_STATUS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    KILLED_BY_FIELD_NUMBER: _ClassVar[int]
    output: str
    error: str
    exit_status: int
    duration_s: float
    cpu_s: float
    cost: float
    timed_out: bool
    killed_by: str
    def __init__(self, output: _Optional[str] = ..., error: _Optional[str] = ..., exit_status: _Optional[int] = ..., duration_s: _Optional[float] = ..., cpu_s: _Optional[float] = ..., cost: _Optional[float] = ..., timed_out: _Optional[bool] = ..., killed_by: _Optional[str] = ...) -> None: ...

class FileChange(_message.Message):
    __slots__ = ("path", "kind", "size", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    kind: FileChangeKind
    size: int
    sha256: str
    def __init__(self, path: _Optional[str] = ..., kind: _Optional[_Union[FileChangeKind, str]] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class ProcessVerdict(_message.Message):
    __slots__ = ("score", "reason")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    score: float
    reason: str
    def __init__(self, score: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class SafetyViolation(_message.Message):
    __slots__ = ("kind", "detail")
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    detail: str
    def __init__(self, kind: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class PolicyTurn(_message.Message):
    __slots__ = ("token_ids", "logprobs", "versions", "finish_reason")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    versions: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., versions: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ...) -> None: ...

class EnvTurn(_message.Message):
    __slots__ = ("token_ids", "tool_call", "result", "side_effects", "verdict", "invalid_call")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    SIDE_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    INVALID_CALL_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    tool_call: ToolCall
    result: ToolResult
    side_effects: _containers.RepeatedCompositeFieldContainer[FileChange]
    verdict: ProcessVerdict
    invalid_call: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., tool_call: _Optional[_Union[ToolCall, _Mapping]] = ..., result: _Optional[_Union[ToolResult, _Mapping]] = ..., side_effects: _Optional[_Iterable[_Union[FileChange, _Mapping]]] = ..., verdict: _Optional[_Union[ProcessVerdict, _Mapping]] = ..., invalid_call: _Optional[str] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("policy", "env")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    policy: PolicyTurn
    env: EnvTurn
    def __init__(self, policy: _Optional[_Union[PolicyTurn, _Mapping]] = ..., env: _Optional[_Union[EnvTurn, _Mapping]] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("generate_s", "tools_s", "verify_s", "total_s")
    GENERATE_S_FIELD_NUMBER: _ClassVar[int]
    TOOLS_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    generate_s: float
    tools_s: float
    verify_s: float
    total_s: float
    def __init__(self, generate_s: _Optional[float] = ..., tools_s: _Optional[float] = ..., verify_s: _Optional[float] = ..., total_s: _Optional[float] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("trajectory_id", "task_id", "env_name", "group_id", "attempt", "prompt_ids", "turns", "termination", "reward_components", "reward", "true_metric", "safety_violations", "infra_error", "timings", "split", "debug")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TERMINATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TRUE_METRIC_FIELD_NUMBER: _ClassVar[int]
    SAFETY_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    INFRA_ERROR_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    DEBUG_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    task_id: str
    env_name: str
    group_id: str
    attempt: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    termination: Termination
    reward_components: _containers.ScalarMap[str, float]
    reward: float
    true_metric: float
    safety_violations: _containers.RepeatedCompositeFieldContainer[SafetyViolation]
    infra_error: InfraErrorClass
    timings: Timings
    split: str
    debug: _struct_pb2.Struct
    def __init__(self, trajectory_id: _Optional[str] = ..., task_id: _Optional[str] = ..., env_name: _Optional[str] = ..., group_id: _Optional[str] = ..., attempt: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., termination: _Optional[_Union[Termination, str]] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., reward: _Optional[float] = ..., true_metric: _Optional[float] = ..., safety_violations: _Optional[_Iterable[_Union[SafetyViolation, _Mapping]]] = ..., infra_error: _Optional[_Union[InfraErrorClass, str]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., split: _Optional[str] = ..., debug: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...
