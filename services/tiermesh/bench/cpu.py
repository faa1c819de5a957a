"""CPU time, measured: the load generator's own cost (a client that saturates its core
measures itself), and any other process's from Linux /proc (the mesh's, in benchmarks).

Counts user + system time of the whole process (gRPC's core threads included) over a span
of wall time.
"""

from __future__ import annotations

import math
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSample:
    user_s: float
    system_s: float
    wall_s: float  # a monotonic clock reading, meaningful only as a difference


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far, every thread (Linux /proc).
    Raises OSError when the process is gone or /proc is absent."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def sample() -> CpuSample:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return CpuSample(usage.ru_utime, usage.ru_stime, time.perf_counter())


def usage(before: CpuSample, after: CpuSample, requests: int) -> dict[str, Any]:
    """CPU seconds, seconds per sent request, and the cores kept busy on average between
    two samples."""
    user = after.user_s - before.user_s
    system = after.system_s - before.system_s
    wall = after.wall_s - before.wall_s
    cpu = user + system
    return {
        "cpu_s": cpu,
        "user_s": user,
        "system_s": system,
        "wall_s": wall,
        "requests": requests,
        "cpu_s_per_request": cpu / requests if requests else math.nan,
        "cores_used": cpu / wall if wall > 0 else math.nan,
    }
