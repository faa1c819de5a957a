"""How the mesh treats one request beyond what it computes: typed fields that travel on the
internal job and come back on its result.

The gateway sets them from the request (its public parameters, its door) and the router and
the batch feeder add theirs; every service reads them as fields. Annotations stay what they
were made for: facts the caller gets back as response parameters (truncated, tokens).

A field marked `public(...)` is a request parameter of the KServe v2 API (gRPC and REST): the
gateway reads every one from the request's `parameters` by that name and refuses a value of
the wrong type. Adding a request parameter end to end is one field here and the code that
reads it.

On the wire the fields are a string map (`Job.controls`, `Result.controls`) written and read
only here: a field left at its default is not sent, and a name or value this version does not
understand (sent by another one) is ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Metadata key of a field that is a public request parameter: its parameter name.
_PARAMETER = "parameter"


def public(default: Any, parameter: str) -> Any:
    """A field read from the request parameter `parameter`."""
    return field(default=default, metadata={_PARAMETER: parameter})


@dataclass(frozen=True, slots=True)
class Controls:
    # Requests with one key see one version of a model during a canary rollout ("" = the
    # tenant's, else the request id's).
    sticky_key: str = public("", "sticky_key")
    # An unsure answer of the edge tier is computed again on the last tier (a model with a
    # `cascade:` section); false: the caller takes the edge answer as it is, sooner.
    cascade: bool = public(True, "cascade")
    # The text is refused rather than cut at the model's length (the OpenAI embeddings door).
    whole_text: bool = False
    # Which side of a running rollout served it: "stable", "canary", or "shadow" for a copy
    # mirrored to the canary ("" = no rollout).
    rollout_arm: str = ""
    # A mirrored copy: the primary's request id.
    shadow_of: str = ""
    # An input of a batch job: the job's id and the input's index.
    batch_job: str = ""
    batch_index: int = 0

    def with_(self, **changes: Any) -> Controls:
        return dataclasses.replace(self, **changes)

    def to_wire(self) -> dict[str, str]:
        """The fields not at their default, as strings."""
        if self is NO_CONTROLS:
            return {}
        out = {}
        for name, default, _ in _FIELDS:
            value = getattr(self, name)
            if value != default:
                out[name] = _text(value)
        return out

    @classmethod
    def from_wire(cls, wire: Mapping[str, str]) -> Controls:
        """Inverse of `to_wire`. A name it does not know, or a value not of its field's
        type (a version of the mesh beside this one, mid-upgrade), is left out: the field
        keeps its default and the request is served, never dropped for it."""
        if not wire:
            return NO_CONTROLS
        values = {}
        for name, _, kind in _FIELDS:
            if name in wire:
                with contextlib.suppress(ValueError):
                    values[name] = _parse(kind, wire[name])
        return cls(**values)

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, object]) -> Controls:
        """The public fields from a request's parameters (bool, int, float or str values, as
        both doors decode them); ValueError naming the parameter for a value of the wrong
        type."""
        values: dict[str, Any] = {}
        for name, parameter, kind in PUBLIC_FIELDS:
            if parameter not in parameters:
                continue
            value = parameters[parameter]
            # bool is an int in Python; neither stands for the other here.
            if type(value) is not kind and not (kind is float and type(value) is int):
                raise ValueError(
                    f"parameter '{parameter}' must be {_KIND_WORDS[kind]}, got "
                    f"{_KIND_WORDS.get(type(value), type(value).__name__)}"
                )
            values[name] = value if kind is not float else float(value)  # type: ignore[arg-type]
        return cls(**values) if values else NO_CONTROLS


NO_CONTROLS = Controls()

_KIND_WORDS: dict[type, str] = {str: "a string", bool: "a bool", int: "an int", float: "a number"}


def _kinds() -> list[tuple[str, Any, type]]:
    types = {"str": str, "bool": bool, "int": int, "float": float}
    out = []
    for f in dataclasses.fields(Controls):
        kind = types.get(str(f.type))
        if kind is None:
            raise TypeError(f"Controls.{f.name}: {f.type} does not travel (str, bool, int, float)")
        out.append((f.name, f.default, kind))
    return out


# (name, default, type) of every field, and (name, parameter, type) of the public ones.
_FIELDS = _kinds()
PUBLIC_FIELDS: list[tuple[str, str, type]] = [
    (f.name, f.metadata[_PARAMETER], kind)
    for f, (_, _, kind) in zip(dataclasses.fields(Controls), _FIELDS, strict=True)
    if _PARAMETER in f.metadata
]
# The public request parameters' names.
PARAMETERS = tuple(parameter for _, parameter, _ in PUBLIC_FIELDS)


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _parse(kind: type, text: str) -> Any:
    if kind is bool:
        if text not in ("0", "1"):
            raise ValueError(f"not a bool on the wire: {text!r}")
        return text == "1"
    return kind(text)
