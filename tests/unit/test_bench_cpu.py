"""bench cpu: the CPU time benchmarks read from /proc for the mesh's processes."""

from __future__ import annotations

import os
import time

import pytest

from tiermesh.bench.cpu import process_cpu_s


def test_process_cpu_counts_this_process_and_refuses_a_missing_one() -> None:
    """benchmarks/ read the mesh's CPU through this (Linux /proc)."""
    before = process_cpu_s(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:  # burn 50 ms of CPU
        pass
    assert process_cpu_s(os.getpid()) > before
    with pytest.raises(OSError):
        process_cpu_s(2**22 + 1)  # above the kernel's pid_max
