from tiermesh.v1 import job_pb2 as _job_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class RouteReply(_message.Message):
    __slots__ = ("stream", "entry_id", "version", "shadow_request_id")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHADOW_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    stream: str
    entry_id: str
    version: str
    shadow_request_id: str
    def __init__(self, stream: _Optional[str] = ..., entry_id: _Optional[str] = ..., version: _Optional[str] = ..., shadow_request_id: _Optional[str] = ...) -> None: ...
