from orrery.v1 import env_pb2 as _env_pb2
from orrery.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnvState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENV_STATE_UNSPECIFIED: _ClassVar[EnvState]
    ENV_STATE_ACTIVE: _ClassVar[EnvState]
    ENV_STATE_PAUSED: _ClassVar[EnvState]
ENV_STATE_UNSPECIFIED: EnvState
ENV_STATE_ACTIVE: EnvState
ENV_STATE_PAUSED: EnvState

class EnvStatus(_message.Message):
    __slots__ = ("spec", "state", "submitted_step", "groups_sampled", "success_rate")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_STEP_FIELD_NUMBER: _ClassVar[int]
    GROUPS_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_RATE_FIELD_NUMBER: _ClassVar[int]
    spec: _env_pb2.EnvSpec
    state: EnvState
    submitted_step: int
    groups_sampled: int
    success_rate: float
    def __init__(self, spec: _Optional[_Union[_env_pb2.EnvSpec, _Mapping]] = ..., state: _Optional[_Union[EnvState, str]] = ..., submitted_step: _Optional[int] = ..., groups_sampled: _Optional[int] = ..., success_rate: _Optional[float] = ...) -> None: ...

class SubmitEnvRequest(_message.Message):
    __slots__ = ("spec", "replace")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    spec: _env_pb2.EnvSpec
    replace: bool
    def __init__(self, spec: _Optional[_Union[_env_pb2.EnvSpec, _Mapping]] = ..., replace: _Optional[bool] = ...) -> None: ...

class SubmitEnvResponse(_message.Message):
    __slots__ = ("env",)
    ENV_FIELD_NUMBER: _ClassVar[int]
    env: EnvStatus
    def __init__(self, env: _Optional[_Union[EnvStatus, _Mapping]] = ...) -> None: ...

class ListEnvsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEnvsResponse(_message.Message):
    __slots__ = ("envs",)
    ENVS_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedCompositeFieldContainer[EnvStatus]
    def __init__(self, envs: _Optional[_Iterable[_Union[EnvStatus, _Mapping]]] = ...) -> None: ...

class GetEnvRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetEnvResponse(_message.Message):
    __slots__ = ("env",)
    ENV_FIELD_NUMBER: _ClassVar[int]
    env: EnvStatus
    def __init__(self, env: _Optional[_Union[EnvStatus, _Mapping]] = ...) -> None: ...

class PauseEnvRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PauseEnvResponse(_message.Message):
    __slots__ = ("env",)
    ENV_FIELD_NUMBER: _ClassVar[int]
    env: EnvStatus
    def __init__(self, env: _Optional[_Union[EnvStatus, _Mapping]] = ...) -> None: ...

class ResumeEnvRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ResumeEnvResponse(_message.Message):
    __slots__ = ("env",)
    ENV_FIELD_NUMBER: _ClassVar[int]
    env: EnvStatus
    def __init__(self, env: _Optional[_Union[EnvStatus, _Mapping]] = ...) -> None: ...

class RemoveEnvRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveEnvResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRunStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRunStatusResponse(_message.Message):
    __slots__ = ("step", "total_steps", "mode", "weights", "rollout_workers", "finished", "latest_metrics")
    class LatestMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    LATEST_METRICS_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    mode: str
    weights: _weights_pb2.WeightVersion
    rollout_workers: int
    finished: bool
    latest_metrics: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., mode: _Optional[str] = ..., weights: _Optional[_Union[_weights_pb2.WeightVersion, _Mapping]] = ..., rollout_workers: _Optional[int] = ..., finished: _Optional[bool] = ..., latest_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class StreamMetricsRequest(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    def __init__(self, prefix: _Optional[str] = ...) -> None: ...

class StreamMetricsResponse(_message.Message):
    __slots__ = ("step", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    step: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...
