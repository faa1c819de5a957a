from tiermesh.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchInput(_message.Message):
    __slots__ = ("inputs",)
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, inputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class SubmitChunk(_message.Message):
    __slots__ = ("model", "variant", "texts", "items")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    model: str
    variant: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    items: _containers.RepeatedCompositeFieldContainer[BatchInput]
    def __init__(self, model: _Optional[str] = ..., variant: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., items: _Optional[_Iterable[_Union[BatchInput, _Mapping]]] = ...) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class BatchJob(_message.Message):
    __slots__ = ("job_id", "model", "status", "total", "done", "errors", "fed", "created_ms", "finished_ms", "tenant", "tier")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    FED_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_MS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model: str
    status: str
    total: int
    done: int
    errors: int
    fed: int
    created_ms: int
    finished_ms: int
    tenant: str
    tier: str
    def __init__(self, job_id: _Optional[str] = ..., model: _Optional[str] = ..., status: _Optional[str] = ..., total: _Optional[int] = ..., done: _Optional[int] = ..., errors: _Optional[int] = ..., fed: _Optional[int] = ..., created_ms: _Optional[int] = ..., finished_ms: _Optional[int] = ..., tenant: _Optional[str] = ..., tier: _Optional[str] = ...) -> None: ...

class ResultsRequest(_message.Message):
    __slots__ = ("job_id", "start", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    start: int
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., start: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("index", "code", "message", "outputs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    code: int
    message: str
    outputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, index: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., outputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...
