from google.protobuf import struct_pb2 as _struct_pb2
from orrery.v1 import env_pb2 as _env_pb2
from orrery.v1 import trajectory_pb2 as _trajectory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListTasksRequest(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: _struct_pb2.Struct
    def __init__(self, args: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_env_pb2.Task]
    def __init__(self, tasks: _Optional[_Iterable[_Union[_env_pb2.Task, _Mapping]]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("task", "args", "safety")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    SAFETY_FIELD_NUMBER: _ClassVar[int]
    task: _env_pb2.Task
    args: _struct_pb2.Struct
    safety: _env_pb2.SafetyPolicy
    def __init__(self, task: _Optional[_Union[_env_pb2.Task, _Mapping]] = ..., args: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., safety: _Optional[_Union[_env_pb2.SafetyPolicy, _Mapping]] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("session_id", "observation", "tools")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    observation: str
    tools: _containers.RepeatedCompositeFieldContainer[_env_pb2.ToolSpec]
    def __init__(self, session_id: _Optional[str] = ..., observation: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[_env_pb2.ToolSpec, _Mapping]]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("session_id", "call")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    call: _trajectory_pb2.ToolCall
    def __init__(self, session_id: _Optional[str] = ..., call: _Optional[_Union[_trajectory_pb2.ToolCall, _Mapping]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("observation", "result", "side_effects", "verdict", "safety_violations", "done")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    SIDE_EFFECTS_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SAFETY_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    observation: str
    result: _trajectory_pb2.ToolResult
    side_effects: _containers.RepeatedCompositeFieldContainer[_trajectory_pb2.FileChange]
    verdict: _trajectory_pb2.ProcessVerdict
    safety_violations: _containers.RepeatedCompositeFieldContainer[_trajectory_pb2.SafetyViolation]
    done: bool
    def __init__(self, observation: _Optional[str] = ..., result: _Optional[_Union[_trajectory_pb2.ToolResult, _Mapping]] = ..., side_effects: _Optional[_Iterable[_Union[_trajectory_pb2.FileChange, _Mapping]]] = ..., verdict: _Optional[_Union[_trajectory_pb2.ProcessVerdict, _Mapping]] = ..., safety_violations: _Optional[_Iterable[_Union[_trajectory_pb2.SafetyViolation, _Mapping]]] = ..., done: _Optional[bool] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("session_id", "answer")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    answer: str
    def __init__(self, session_id: _Optional[str] = ..., answer: _Optional[str] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("reward_components", "true_metric", "verified")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    TRUE_METRIC_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    reward_components: _containers.ScalarMap[str, float]
    true_metric: float
    verified: bool
    def __init__(self, reward_components: _Optional[_Mapping[str, float]] = ..., true_metric: _Optional[float] = ..., verified: _Optional[bool] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
