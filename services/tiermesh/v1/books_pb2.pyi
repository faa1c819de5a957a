from tiermesh.v1 import job_pb2 as _job_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Entry(_message.Message):
    __slots__ = ("request_id", "model", "version", "code", "received_ns", "ended_ns", "routed", "routed_version", "shadow_request_id", "result", "caller_left", "ms_left", "job", "trace")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_NS_FIELD_NUMBER: _ClassVar[int]
    ENDED_NS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_FIELD_NUMBER: _ClassVar[int]
    ROUTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHADOW_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CALLER_LEFT_FIELD_NUMBER: _ClassVar[int]
    MS_LEFT_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    version: str
    code: int
    received_ns: int
    ended_ns: int
    routed: bool
    routed_version: str
    shadow_request_id: str
    result: _job_pb2.Result
    caller_left: bool
    ms_left: int
    job: _job_pb2.Job
    trace: Trace
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., code: _Optional[int] = ..., received_ns: _Optional[int] = ..., ended_ns: _Optional[int] = ..., routed: _Optional[bool] = ..., routed_version: _Optional[str] = ..., shadow_request_id: _Optional[str] = ..., result: _Optional[_Union[_job_pb2.Result, _Mapping]] = ..., caller_left: _Optional[bool] = ..., ms_left: _Optional[int] = ..., job: _Optional[_Union[_job_pb2.Job, _Mapping]] = ..., trace: _Optional[_Union[Trace, _Mapping]] = ...) -> None: ...

class Trace(_message.Message):
    __slots__ = ("trace_id", "span_id", "route_span_id", "parent_span_id", "tracestate", "stream", "entry_id", "route_began_ns", "route_ended_ns", "client_request_id", "placed_here")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SPAN_ID_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_BEGAN_NS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_ENDED_NS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PLACED_HERE_FIELD_NUMBER: _ClassVar[int]
    trace_id: bytes
    span_id: int
    route_span_id: int
    parent_span_id: int
    tracestate: str
    stream: str
    entry_id: str
    route_began_ns: int
    route_ended_ns: int
    client_request_id: str
    placed_here: bool
    def __init__(self, trace_id: _Optional[bytes] = ..., span_id: _Optional[int] = ..., route_span_id: _Optional[int] = ..., parent_span_id: _Optional[int] = ..., tracestate: _Optional[str] = ..., stream: _Optional[str] = ..., entry_id: _Optional[str] = ..., route_began_ns: _Optional[int] = ..., route_ended_ns: _Optional[int] = ..., client_request_id: _Optional[str] = ..., placed_here: _Optional[bool] = ...) -> None: ...

class Mirrored(_message.Message):
    __slots__ = ("shadow_request_id", "model", "deadline_ns")
    SHADOW_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_NS_FIELD_NUMBER: _ClassVar[int]
    shadow_request_id: str
    model: str
    deadline_ns: int
    def __init__(self, shadow_request_id: _Optional[str] = ..., model: _Optional[str] = ..., deadline_ns: _Optional[int] = ...) -> None: ...

class Refused(_message.Message):
    __slots__ = ("model", "version", "count", "total_ns")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_NS_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: str
    count: int
    total_ns: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[str] = ..., count: _Optional[int] = ..., total_ns: _Optional[int] = ...) -> None: ...

class Entries(_message.Message):
    __slots__ = ("entries", "shadows", "mirrored", "refused")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    SHADOWS_FIELD_NUMBER: _ClassVar[int]
    MIRRORED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    shadows: _containers.RepeatedCompositeFieldContainer[_job_pb2.Result]
    mirrored: _containers.RepeatedCompositeFieldContainer[Mirrored]
    refused: _containers.RepeatedCompositeFieldContainer[Refused]
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ..., shadows: _Optional[_Iterable[_Union[_job_pb2.Result, _Mapping]]] = ..., mirrored: _Optional[_Iterable[_Union[Mirrored, _Mapping]]] = ..., refused: _Optional[_Iterable[_Union[Refused, _Mapping]]] = ...) -> None: ...

class Recorded(_message.Message):
    __slots__ = ("entries", "capture_rate")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_RATE_FIELD_NUMBER: _ClassVar[int]
    entries: int
    capture_rate: float
    def __init__(self, entries: _Optional[int] = ..., capture_rate: _Optional[float] = ...) -> None: ...
