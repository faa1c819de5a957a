"""Seeded request mixes: which length class and priority each request gets, and its input.

The same seed, mix and model inputs give the same sequence of requests, so two runs (or
two meshes) see identical work. Shares are exact per block of `BLOCK` requests (largest
remainder), shuffled within the block, so even a short run holds the mix it asked for.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt
import yaml

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BLOCK = 100
DEFAULT_MIX = (("short", 0.70), ("medium", 0.25), ("long", 0.05))
# 0 asks for the model's default priority (tritonclient sends no parameter then).
DEFAULT_PRIORITIES = ((0, 1.0),)
# Words per length class, inclusive. These words are one WordPiece token each in the
# MiniLM vocabularies, so with [CLS] and [SEP] the classes land in the 16, 64 and 128
# token buckets.
DEFAULT_LENGTHS = {"short": (6, 12), "medium": (38, 58), "long": (100, 120)}
T = TypeVar("T")
NUMERIC = "numeric"  # the length label of requests to models without a text input

WORDS = tuple(
    """
    about above across after again against air all almost along also always among animal
    answer any apple area around ask away back ball bank base bear because bed been before
    began begin behind being below best better between big bird black blue boat body book
    both box boy bring brown build busy call came can car care carry case cat cause center
    chair change check child city class clear close cloud cold color come common cook
    corner could country course cover cross cut dark day deep did different dinner dog door
    down draw dream dress drive dry during each early earth east easy eat edge egg end
    enough even evening ever every example eye face fact fall family far farm fast father
    feel few field fill find fine fire first fish five floor flower fly follow food foot
    for force forest form four free friend from front full game garden gave girl give glass
    go gold good great green ground group grow had half hand happy hard has have head hear
    heart heavy help her here high hill him his hold home horse hot hour house how idea
    inside island just keep kind king knew know lake land large last late laugh learn leave
    left less letter light line list little live long look low made make man many map mark
    may mean meet men middle might mile milk mind minute miss money month moon more morning
    most mother mountain move much music must name near need never new next night north
    note now number ocean off often old once only open order other our out over page paper
    part party pass past people person picture piece place plant play point pool poor
    power press problem pull put question quick quiet rain ran read ready real red rest
    rich ride right river road rock room round run said same sand saw say school sea season
    second see seen send sense set seven shape ship shop short should show side simple
    since sing sister sit six size sleep slow small snow some song soon sound south space
    speak special spring stand star start state stay step still stone stop story street
    strong study such summer sun sure table take talk tall teacher tell ten than that the
    their them then there these thing think this those three through time today together
    told too took top toward town track train tree true try turn two under until upon use
    very voice wait walk wall want warm was watch water way weather week well went were
    west what wheel when where which while white who whole why wide will wind window
    winter with without woman wood word work world would write year yellow young
    """.split()
)
_DTYPES: dict[str, npt.DTypeLike] = {
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "BOOL": np.bool_,
}


@dataclass(frozen=True)
class InputSpec:
    """One model input as its metadata declares it (-1 for a variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class WorkloadTensor:
    name: str
    datatype: str
    array: npt.NDArray[Any]


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: its place in the sequence, its labels and its inputs;
    `parameters` are request parameters beside them (generation: max_new_tokens ...)."""

    index: int
    length: str
    priority: int
    inputs: tuple[WorkloadTensor, ...]
    parameters: Mapping[str, str | int | float | bool] = field(default_factory=dict)


def parse_shares(text: str) -> tuple[tuple[str, float], ...]:
    """`"a=0.7,b=0.3"` -> (("a", 0.7), ("b", 0.3)), normalised to sum 1.
    ValueError on a malformed item, a negative share, a repeated key or no positive share."""
    out: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"expected key=share, got {item.strip()!r}")
        if key in out:
            raise ValueError(f"{key!r} given twice")
        try:
            share = float(value)
        except ValueError:
            raise ValueError(f"share of {key!r} is not a number: {value!r}") from None
        if not share >= 0 or share == float("inf"):
            raise ValueError(f"share of {key!r} must be a finite number >= 0, got {value!r}")
        out[key] = share
    total = sum(out.values())
    if total <= 0:
        raise ValueError("at least one share must be positive")
    return tuple((k, v / total) for k, v in out.items())


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    shares = parse_shares(text)
    unknown = [k for k, _ in shares if k not in DEFAULT_LENGTHS]
    if unknown:
        raise ValueError(f"unknown length class {unknown}; known: {', '.join(DEFAULT_LENGTHS)}")
    return shares


def parse_priorities(text: str) -> tuple[tuple[int, float], ...]:
    shares = parse_shares(text)
    try:
        levels = [(int(k), v) for k, v in shares]
    except ValueError:
        raise ValueError(f"priority levels must be integers, got {text!r}") from None
    if any(level < 0 for level, _ in levels):
        raise ValueError("priority levels must be >= 0 (0: the model's default)")
    return tuple(levels)


def parse_lengths(text: str) -> dict[str, tuple[int, int]]:
    """`"short=6-12,long=100-120"` -> words per class (inclusive), over the defaults."""
    out = dict(DEFAULT_LENGTHS)
    for item in text.split(","):
        key, _, span = item.strip().partition("=")
        lo, sep, hi = span.partition("-")
        if key not in DEFAULT_LENGTHS or not sep:
            raise ValueError(f"expected class=MIN-MAX with a class of {list(DEFAULT_LENGTHS)}")
        words = (int(lo), int(hi))
        if not 1 <= words[0] <= words[1]:
            raise ValueError(f"{key}: need 1 <= MIN <= MAX words, got {span!r}")
        out[key] = words
    return out


def block_counts(shares: Sequence[float], block: int = BLOCK) -> list[int]:
    """How many of each label a block of `block` requests holds: floor of share x block,
    the remainder to the largest fractional parts (earlier labels win ties)."""
    raw = [s * block for s in shares]
    counts = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (counts[i] - raw[i], i))
    for i in order[: block - sum(counts)]:
        counts[i] += 1
    return counts


def labels(
    shares: Sequence[tuple[T, float]], rng: np.random.Generator, block: int = BLOCK
) -> Iterator[T]:
    """An endless sequence of labels in exact proportions per block, shuffled per block."""
    keys = [k for k, _ in shares]
    counts = block_counts([s for _, s in shares], block)
    template = [k for k, c in zip(keys, counts, strict=True) for _ in range(c)]
    while True:
        for i in rng.permutation(len(template)):
            yield template[int(i)]


def make_text(rng: np.random.Generator, n_words: int) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=n_words))


def counting_tokenizer(model_dir: Path) -> Tokenizer:
    """The text tokenizer of a committed model folder (its stable version's), with padding
    and truncation off, so `encode` counts a text's own tokens (the shipped MiniLM file
    pads every text to 128). For workloads whose texts are made to a token count."""
    from tokenizers import Tokenizer  # not at import: most workloads carry tensors

    from tiermesh.core.model_config import parse_config

    config = parse_config(yaml.safe_load((model_dir / "config.yaml").read_text()), str(model_dir))
    if config.tokenize is None:
        raise ValueError(f"model {model_dir.name!r} takes no text: no tokenize section")
    path = model_dir / config.version_for("") / config.tokenize.tokenizer_file
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def text_with_tokens(
    tokenizer: Tokenizer, rng: np.random.Generator, target: int
) -> tuple[str, int]:
    """Random words, dropped or added one at a time until `tokenizer` counts `target`
    tokens ([CLS] and [SEP] included); returns the text and its count, which is `target`
    unless the last word added spans more than one token (then the nearest above)."""
    words = [WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=max(target - 2, 1))]
    count = len(tokenizer.encode(" ".join(words)).ids)
    while count > target and len(words) > 1:
        words.pop()
        count = len(tokenizer.encode(" ".join(words)).ids)
    while count < target:
        words.append(WORDS[int(rng.integers(0, len(WORDS)))])
        count = len(tokenizer.encode(" ".join(words)).ids)
    return " ".join(words), count


@dataclass(frozen=True)
class TokenText:
    text: bytes
    kind: str  # the length class it was made for
    tokens: int  # [CLS] and [SEP] included, as the model's tokenizer counts them


def mixed_texts(
    tokenizer: Tokenizer,
    rng: np.random.Generator,
    n: int,
    classes: Sequence[tuple[str, float, tuple[int, int]]],
) -> list[TokenText]:
    """`n` texts in the exact proportions of `classes` ((kind, share, token range); rounded,
    remainder to the first), shuffled, each of a length drawn from its class's range."""
    counts = [round(n * share) for _, share, _ in classes]
    counts[0] += n - sum(counts)
    labels = [(k, span) for (k, _, span), c in zip(classes, counts, strict=True) for _ in range(c)]
    out = []
    for i in rng.permutation(len(labels)):
        kind, (lo, hi) = labels[int(i)]
        text, count = text_with_tokens(tokenizer, rng, int(rng.integers(lo, hi + 1)))
        out.append(TokenText(text.encode(), kind, count))
    return out


def is_text_model(inputs: Sequence[InputSpec]) -> bool:
    return any(spec.datatype == "BYTES" for spec in inputs)


def request_shape(spec: InputSpec) -> tuple[int, ...]:
    """The shape of one request: every variable dimension (the batch one included) is 1."""
    return tuple(1 if d < 0 else d for d in spec.shape)


class Workload:
    """An endless, seeded sequence of requests for one model.

    Text models (any BYTES input): each request draws a length class from `mix` and a
    text of that many words; numeric inputs get seeded random values (normal for floats,
    0 or 1 for integers, so masks and ids stay valid). Length classes, priorities and
    contents come from independent streams of one seed: changing the priority shares
    leaves the texts as they were."""

    def __init__(
        self,
        inputs: Sequence[InputSpec],
        seed: int,
        mix: Sequence[tuple[str, float]] = DEFAULT_MIX,
        priorities: Sequence[tuple[int, float]] = DEFAULT_PRIORITIES,
        lengths: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        if not inputs:
            raise ValueError("the model declares no inputs")
        unknown = [
            s.datatype for s in inputs if s.datatype != "BYTES" and s.datatype not in _DTYPES
        ]
        if unknown:
            raise ValueError(f"cannot generate inputs of type {unknown}")
        self.inputs = tuple(inputs)
        self.text = is_text_model(inputs)
        self.lengths = dict(lengths or DEFAULT_LENGTHS)
        mix_rng, priority_rng, self._content = (
            np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
        )
        self._mix = labels(mix if self.text else ((NUMERIC, 1.0),), mix_rng)
        self._priorities = labels(priorities, priority_rng)
        self._index = 0

    def __iter__(self) -> Iterator[RequestSpec]:
        return self

    def __next__(self) -> RequestSpec:
        length = next(self._mix)
        priority = next(self._priorities)
        tensors = tuple(self._tensor(spec, length) for spec in self.inputs)
        spec = RequestSpec(self._index, length, priority, tensors)
        self._index += 1
        return spec

    def _tensor(self, spec: InputSpec, length: str) -> WorkloadTensor:
        shape = request_shape(spec)
        rng = self._content
        if spec.datatype == "BYTES":
            lo, hi = self.lengths[length]
            count = int(np.prod(shape))
            texts = [make_text(rng, int(rng.integers(lo, hi + 1))).encode() for _ in range(count)]
            array = np.array(texts, dtype=np.object_).reshape(shape)
        else:
            dtype = np.dtype(_DTYPES[spec.datatype])
            if np.issubdtype(dtype, np.floating):
                array = rng.standard_normal(shape).astype(dtype)
            else:
                array = rng.integers(0, 2, size=shape).astype(dtype)
        return WorkloadTensor(spec.name, spec.datatype, array)
