"""The garbage collector in a long-running service process."""

from __future__ import annotations

import gc


def settle_heap(_ports: dict[str, int] | None = None) -> None:
    """Called once a service serves (its `ready` callback in `__main__`): collect, then move
    every object alive into the permanent generation (`gc.freeze`). What start-up made
    (imports, generated protos, the model repository, onnxruntime sessions) then stays out
    of the collector's full passes, which otherwise walk all of it, in the middle of
    requests, every time enough young objects survive."""
    gc.collect()
    gc.freeze()
