from tiermesh.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Deliveries(_message.Message):
    __slots__ = ("results", "batch_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_job_pb2.Result]
    batch_id: int
    def __init__(self, results: _Optional[_Iterable[_Union[_job_pb2.Result, _Mapping]]] = ..., batch_id: _Optional[int] = ...) -> None: ...

class DeliverReply(_message.Message):
    __slots__ = ("resolved", "late", "batch_id")
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    LATE_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    resolved: int
    late: int
    batch_id: int
    def __init__(self, resolved: _Optional[int] = ..., late: _Optional[int] = ..., batch_id: _Optional[int] = ...) -> None: ...
