from tiermesh.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResultBatch(_message.Message):
    __slots__ = ("results", "batch_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_job_pb2.Result]
    batch_id: int
    def __init__(self, results: _Optional[_Iterable[_Union[_job_pb2.Result, _Mapping]]] = ..., batch_id: _Optional[int] = ...) -> None: ...

class ProcessReply(_message.Message):
    __slots__ = ("delivered", "undeliverable", "batch_id")
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    UNDELIVERABLE_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    delivered: int
    undeliverable: int
    batch_id: int
    def __init__(self, delivered: _Optional[int] = ..., undeliverable: _Optional[int] = ..., batch_id: _Optional[int] = ...) -> None: ...
