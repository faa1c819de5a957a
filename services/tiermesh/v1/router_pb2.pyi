from tiermesh.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobBatch(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_job_pb2.Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[_job_pb2.Job, _Mapping]]] = ...) -> None: ...

class RouteReplies(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[RouteReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[RouteReply, _Mapping]]] = ...) -> None: ...

class RouteReply(_message.Message):
    __slots__ = ("stream", "entry_id", "version", "shadow_request_id", "request_id", "code", "message", "retry_after_ms")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHADOW_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    stream: str
    entry_id: str
    version: str
    shadow_request_id: str
    request_id: str
    code: int
    message: str
    retry_after_ms: int
    def __init__(self, stream: _Optional[str] = ..., entry_id: _Optional[str] = ..., version: _Optional[str] = ..., shadow_request_id: _Optional[str] = ..., request_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...
