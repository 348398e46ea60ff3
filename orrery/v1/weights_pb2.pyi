from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WeightFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_FORMAT_UNSPECIFIED: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_ORBAX: _ClassVar[WeightFormat]
    WEIGHT_FORMAT_HF_SAFETENSORS: _ClassVar[WeightFormat]
WEIGHT_FORMAT_UNSPECIFIED: WeightFormat
WEIGHT_FORMAT_ORBAX: WeightFormat
WEIGHT_FORMAT_HF_SAFETENSORS: WeightFormat

class WeightVersion(_message.Message):
    __slots__ = ("version", "learner_step", "location", "format", "digest", "created_unix_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LEARNER_STEP_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    version: int
    learner_step: int
    location: str
    format: WeightFormat
    digest: str
    created_unix_s: float
    def __init__(self, version: _Optional[int] = ..., learner_step: _Optional[int] = ..., location: _Optional[str] = ..., format: _Optional[_Union[WeightFormat, str]] = ..., digest: _Optional[str] = ..., created_unix_s: _Optional[float] = ...) -> None: ...
