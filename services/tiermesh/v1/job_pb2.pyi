from tiermesh.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Timing(_message.Message):
    __slots__ = ("received_ns", "routed_ns", "dequeued_ns", "batch_start_ns", "batch_end_ns", "postprocessed_ns", "delivered_ns", "enqueued_ns")
    RECEIVED_NS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_NS_FIELD_NUMBER: _ClassVar[int]
    DEQUEUED_NS_FIELD_NUMBER: _ClassVar[int]
    BATCH_START_NS_FIELD_NUMBER: _ClassVar[int]
    BATCH_END_NS_FIELD_NUMBER: _ClassVar[int]
    POSTPROCESSED_NS_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_NS_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_NS_FIELD_NUMBER: _ClassVar[int]
    received_ns: int
    routed_ns: int
    dequeued_ns: int
    batch_start_ns: int
    batch_end_ns: int
    postprocessed_ns: int
    delivered_ns: int
    enqueued_ns: int
    def __init__(self, received_ns: _Optional[int] = ..., routed_ns: _Optional[int] = ..., dequeued_ns: _Optional[int] = ..., batch_start_ns: _Optional[int] = ..., batch_end_ns: _Optional[int] = ..., postprocessed_ns: _Optional[int] = ..., delivered_ns: _Optional[int] = ..., enqueued_ns: _Optional[int] = ...) -> None: ...

class Generation(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_p", "seed", "stop", "stream", "messages", "raw_prompt")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RAW_PROMPT_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stream: bool
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    raw_prompt: bool
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stream: _Optional[bool] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., raw_prompt: _Optional[bool] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("request_id", "client_request_id", "tenant", "model", "version", "variant", "priority", "bucket", "tier", "deadline_ns", "gateway", "inputs", "requested_outputs", "timing", "trace_context", "annotations", "generation", "controls")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ControlsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_NS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CONTROLS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    client_request_id: str
    tenant: str
    model: str
    version: str
    variant: str
    priority: int
    bucket: int
    tier: str
    deadline_ns: int
    gateway: str
    inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    requested_outputs: _containers.RepeatedScalarFieldContainer[str]
    timing: Timing
    trace_context: _containers.ScalarMap[str, str]
    annotations: _containers.ScalarMap[str, str]
    generation: Generation
    controls: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., client_request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., variant: _Optional[str] = ..., priority: _Optional[int] = ..., bucket: _Optional[int] = ..., tier: _Optional[str] = ..., deadline_ns: _Optional[int] = ..., gateway: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., requested_outputs: _Optional[_Iterable[str]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., annotations: _Optional[_Mapping[str, str]] = ..., generation: _Optional[_Union[Generation, _Mapping]] = ..., controls: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("request_id", "client_request_id", "model", "version", "gateway", "code", "message", "outputs", "timing", "trace_context", "tier", "priority", "bucket", "batch_size", "annotations", "aux", "variant", "worker", "partial", "text_offset", "batch_traceparent", "direct", "controls")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ControlsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    AUX_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    TEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BATCH_TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    DIRECT_FIELD_NUMBER: _ClassVar[int]
    CONTROLS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    client_request_id: str
    model: str
    version: str
    gateway: str
    code: int
    message: str
    outputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    timing: Timing
    trace_context: _containers.ScalarMap[str, str]
    tier: str
    priority: int
    bucket: int
    batch_size: int
    annotations: _containers.ScalarMap[str, str]
    aux: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    variant: str
    worker: str
    partial: bool
    text_offset: int
    batch_traceparent: str
    direct: bool
    controls: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., client_request_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[str] = ..., gateway: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., outputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., tier: _Optional[str] = ..., priority: _Optional[int] = ..., bucket: _Optional[int] = ..., batch_size: _Optional[int] = ..., annotations: _Optional[_Mapping[str, str]] = ..., aux: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., variant: _Optional[str] = ..., worker: _Optional[str] = ..., partial: _Optional[bool] = ..., text_offset: _Optional[int] = ..., batch_traceparent: _Optional[str] = ..., direct: _Optional[bool] = ..., controls: _Optional[_Mapping[str, str]] = ...) -> None: ...
