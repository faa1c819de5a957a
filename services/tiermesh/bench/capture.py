"""`tiermesh bench capture start|stop|clear|export|key`: the gateways' traffic capture,
driven through Redis (the control hash every gateway's capture writer reads each round) and
read back from the capture stream as JSON lines. See gateway/capture.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import redis
from cryptography.fernet import Fernet

from tiermesh.core import keys

EXPORT_CHUNK = 1000


def start(client: redis.Redis, rate: float, window_s: float, now_ms: float | None = None) -> None:
    """Every gateway samples `rate` of its requests from its next round, for `window_s`
    (0: until stopped)."""
    if not 0 < rate <= 1:
        raise ValueError("--rate must be in (0, 1]")
    now = time.time() * 1e3 if now_ms is None else now_ms
    until = now + window_s * 1000 if window_s > 0 else 0
    client.hset(keys.CAPTURE_CONTROL, mapping={"rate": rate, "until_ms": until})


def stop(client: redis.Redis) -> None:
    """Every gateway stops sampling from its next round (whatever its settings say)."""
    client.hset(keys.CAPTURE_CONTROL, mapping={"rate": 0, "until_ms": 0})


def release(client: redis.Redis) -> None:
    """Back to each gateway's own settings (TIERMESH_CAPTURE_SAMPLE_RATE ...)."""
    client.delete(keys.CAPTURE_CONTROL)


def clear(client: redis.Redis) -> int:
    """Deletes the captured records; returns how many there were."""
    n = int(client.xlen(keys.CAPTURE_STREAM))
    client.delete(keys.CAPTURE_STREAM)
    return n


def records(client: redis.Redis) -> list[dict[str, Any]]:
    """Every captured record in stream (arrival) order."""
    out: list[dict[str, Any]] = []
    start_id = "-"
    while True:
        reply: Any = client.xrange(keys.CAPTURE_STREAM, min=start_id, count=EXPORT_CHUNK)
        chunk: list[tuple[Any, dict[Any, Any]]] = list(reply or [])
        for _entry_id, fields in chunk:
            raw = fields.get(b"r") or fields.get("r")
            if raw:
                out.append(json.loads(raw))
        if len(chunk) < EXPORT_CHUNK:
            return sorted(out, key=lambda r: float(r["t_ms"]))
        last = chunk[-1][0]
        start_id = "(" + (last.decode() if isinstance(last, bytes) else str(last))


def export(client: redis.Redis, out: Path) -> int:
    """Writes the capture as JSON lines to `out`; returns the number of records."""
    found = records(client)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for rec in found:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return len(found)


def new_key() -> str:
    """A fresh Fernet key for TIERMESH_CAPTURE_CONTENTS_KEY."""
    return Fernet.generate_key().decode()
