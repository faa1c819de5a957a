"""The response parameters the README documents (its "Response parameters" table), and
every mention of one in README.md and benchmarks/README.md, for tests that hold the docs
and the wire to one set of names."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "benchmarks" / "README.md")
PREFIX = "tiermesh."
# | `tiermesh.queue_ms` | double | computed | ... |
_ROW = re.compile(r"^\| `(tiermesh\.[a-z_]+)` \| (\w+) \| ([a-z ]+) \|", re.MULTILINE)
# A whole backticked token that starts with the prefix: `tiermesh.tier`, `tiermesh.*_ms`.
_MENTION = re.compile(r"`(tiermesh\.[a-z_*]+)`")
# A backticked bare name ending in _ms (the old, unprefixed spelling of a stage time).
_BARE_MS = re.compile(r"`([a-z_]+_ms)`")


def documented() -> dict[str, tuple[str, str]]:
    """Each documented parameter -> (its type, when it is sent), from README.md's table."""
    rows = {name: (kind, when) for name, kind, when in _ROW.findall(DOCS[0].read_text())}
    assert rows, "README.md has no response parameter table"
    return rows


def documented_for(*whens: str) -> set[str]:
    """The parameters sent in the situations named ("always", "computed", "text", ...)."""
    return {name for name, (_, when) in documented().items() if when in whens}


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def undocumented_mentions() -> list[str]:
    """Mentions in the docs of a `tiermesh.` parameter the table does not have (a module
    name such as `tiermesh.generate` is not a parameter), and of a documented `_ms` name
    without its prefix."""
    names = set(documented())
    bare = {name.removeprefix(PREFIX) for name in names if name.endswith("_ms")}
    wrong = []
    for doc in DOCS:
        text = doc.read_text()
        for token in _MENTION.findall(text):
            if "*" in token:
                if not fnmatch.filter(names, token):
                    wrong.append(f"{doc.name}: {token}")
            elif token not in names and not _is_module(token):
                wrong.append(f"{doc.name}: {token}")
        stale = [token for token in _BARE_MS.findall(text) if token in bare]
        wrong += [f"{doc.name}: {token} (unprefixed)" for token in stale]
    return wrong
