"""Text sets for calibrating and evaluating model variants.

Two small sets ship with the package (`data/calibration.txt`, `data/eval.txt`, written for
this project): short and long inputs (some past 128 WordPiece tokens), several languages and
scripts, digits, punctuation, log lines and ML-serving vocabulary. Users can bring their own
file: plain text (one text per line) or JSON Lines (one object with a "text" string per line).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Literal

_KINDS = ("calibration", "eval")


def _lines(content: str) -> list[str]:
    return [line.strip() for line in content.splitlines() if line.strip()]


def builtin_texts(kind: Literal["calibration", "eval"]) -> list[str]:
    """The shipped set `kind`: one text per non-empty line."""
    if kind not in _KINDS:
        raise ValueError(f"unknown built-in text set {kind!r}; expected one of {_KINDS}")
    resource = resources.files("tiermesh.optimize") / "data" / f"{kind}.txt"
    return _lines(resource.read_text(encoding="utf-8"))


def read_texts(path: Path) -> list[str]:
    """Texts of a user file: `.jsonl` -> the "text" field of each non-empty line, anything
    else -> one text per non-empty line. ValueError names the file (and line) on bad input."""
    try:
        content = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror or e})") from e
    if Path(path).suffix.lower() == ".jsonl":
        texts = []
        for number, line in enumerate(content.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not valid JSON ({e.msg})") from e
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise ValueError(f'{path}:{number}: expected an object with a "text" string')
            if text.strip():
                texts.append(text.strip())
    else:
        texts = _lines(content)
    if not texts:
        raise ValueError(f"{path}: no texts (the file is empty or holds only blank lines)")
    return texts


def texts_sha256(texts: Sequence[str]) -> str:
    """Digest of an ordered text set (each text UTF-8, newline-terminated), for reports."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()
