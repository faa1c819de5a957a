"""When and how the model fetch shows progress: tqdm bars on stderr, never on stdout.

Bars appear only when the caller asks for progress and stderr is a terminal, or when the
environment variable TIERMESH_PROGRESS is "force" (for logs that want the bars anyway).
"""

from __future__ import annotations

import io
import os
import sys

from tqdm import tqdm

FORCE_ENV = "TIERMESH_PROGRESS"


def progress_enabled(progress: bool) -> bool:
    if not progress:
        return False
    if os.environ.get(FORCE_ENV, "").strip().lower() == "force":
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


def stderr_fd() -> int | None:
    """The file descriptor behind sys.stderr, or None when it has none (captured)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return None


class ProgressSteps:
    """A bar over the steps of one conversion, counting finished steps; silent when
    disabled. Use as a context manager and call `next` at the start of every step."""

    def __init__(self, desc: str, total: int, enabled: bool) -> None:
        self._bar = tqdm(total=total, desc=desc, unit="step", disable=not enabled, file=sys.stderr)
        self._running = False

    def next(self, name: str) -> None:
        """Counts the step that was running as done and shows `name` as running."""
        if self._running:
            self._bar.update(1)
        self._running = True
        self._bar.set_postfix_str(name)

    def __enter__(self) -> ProgressSteps:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None and self._running:
            self._bar.update(1)
            self._bar.set_postfix_str("done")
        self._bar.close()
