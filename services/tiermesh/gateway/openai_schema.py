"""The request bodies of the OpenAI door (`/v1/embeddings`, `/v1/chat/completions`,
`/v1/completions`) as OpenAI's API reference defines them, checked by pydantic in strict
mode: a field of the wrong type is refused naming it (`messages[0].role`), a field OpenAI
defines that tiermesh does not do is refused when it asks for something (`n` above 1,
`logprobs`, `tools`), and a field nobody defines is ignored, as OpenAI ignores it. Pure.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import grpc
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tiermesh.core.errors import MeshError

# OpenAI's own bound on the items of one embeddings call.
MAX_EMBEDDING_INPUTS = 2048


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class EmbeddingsBody(_Body):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    # "developer" is what OpenAI's newer models call "system".
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    user: str | None = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatBody(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[Any] | None = None


class CompletionBody(_Sampling):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None


B = TypeVar("B", bound=_Body)


def parsed(kind: type[B], body: bytes) -> B:
    """The body as `kind`, or INVALID_ARGUMENT naming the first field that is wrong."""
    try:
        return kind.model_validate_json(body)
    except ValidationError as exc:
        raise _refusal(exc) from None


def unsupported(body: _Sampling) -> MeshError | None:
    """What a sampling body asks for that tiermesh does not do (None: nothing)."""
    if body.n is not None and body.n != 1:
        return param_error("n", "only n=1 is supported: one answer per request")
    if body.logprobs:
        return param_error("logprobs", "log probabilities are not supported")
    if isinstance(body, ChatBody) and body.tools:
        return param_error("tools", "tools (function calling) are not supported")
    if isinstance(body, CompletionBody):
        if body.echo:
            return param_error("echo", "echo is not supported")
        if body.suffix:
            return param_error("suffix", "suffix is not supported")
    return None


class ParamError(MeshError):
    """INVALID_ARGUMENT about one field of the body (OpenAI's error `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, message)
        self.param = param


def param_error(param: str, message: str) -> ParamError:
    return ParamError(param, f"{param}: {message}")


def _refusal(exc: ValidationError) -> ParamError:
    error = exc.errors(include_url=False)[0]
    loc = error.get("loc", ())
    param = _param(loc)
    if error.get("type") == "json_invalid":
        return ParamError("", f"the body is not valid JSON: {error.get('msg', '')}")
    if not param:
        return ParamError("", f"the body must be a JSON object: {error.get('msg', '')}")
    if param in _UNIONS:
        return param_error(param, f"expected {_UNIONS[param]}")
    return param_error(param, str(error.get("msg", "invalid")).lower())


# How pydantic names the member of a union that failed, in an error's location.
_MEMBERS = frozenset({"str", "int", "float", "bool", "none"})

# What a field of several types may be, for a refusal that names all of them.
_UNIONS = {
    "input": "a string, a list of strings, a list of token ids or a list of lists of token ids",
    "prompt": "a string or a list of strings",
    "stop": "a string or a list of strings",
}


def _param(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as OpenAI writes a param: `messages[0].content`. The
    member of a union that failed (`str`, `list[int]`) is left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _MEMBERS or part.startswith(("list[", "literal[", "function-", "dict[")):
            continue
        else:
            out += f".{part}" if out else part
    return out
