"""A compute unit: what one work stream carries and one session runs.

One variant of one version of a model, written ``mlp@1.fp32`` wherever it must be text (a
stream name, a metric label, a log line). This module is the only one that writes or reads
that text: everything else holds a `ComputeUnit` and asks it for its parts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True, repr=False)
class ComputeUnit:
    """Model, version and variant names hold neither '@' nor '.' (the repository checks), so
    the text form parses back. Its repr is the text form too: what log lines show."""

    model: str
    version: str
    variant: str

    def __str__(self) -> str:
        return f"{self.model}@{self.version}.{self.variant}"

    __repr__ = __str__

    @property
    def labels(self) -> tuple[str, str, str]:
        """(model, version, variant): the metric labels of a unit, in that order."""
        return (self.model, self.version, self.variant)

    @property
    def tagged(self) -> str:
        """The text form with the model's Redis Cluster hash tag: "{mlp}@1.fp32" (keys.py)."""
        return f"{{{self.model}}}@{self.version}.{self.variant}"

    @classmethod
    def parse(cls, text: str) -> ComputeUnit:
        """Inverse of str(); raises ValueError on anything else."""
        rest, dot, variant = text.rpartition(".")
        model, at, version = rest.rpartition("@")
        if not (dot and at and model and version and variant):
            raise ValueError(f"not a compute unit: {text!r}")
        return cls(model, version, variant)

    @classmethod
    def parse_tagged(cls, text: str) -> ComputeUnit:
        """Inverse of `tagged`; raises ValueError on text without the tag."""
        if not text.startswith("{") or "}" not in text:
            raise ValueError(f"no hash tag in {text!r}")
        name, _, rest = text[1:].partition("}")
        return cls.parse(name + rest)
