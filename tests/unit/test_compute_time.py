"""worker/runner.py ComputeTime: what counts as onnxruntime's CPU."""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry

from tiermesh.worker.runner import ComputeTime

BURN_S = 0.2


def burn(cpu_s: float) -> None:
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        pass


def cpu_counted(per_thread: bool) -> float:
    """A call that waits (no CPU of its own) while another thread burns BURN_S of CPU."""
    clock = ComputeTime(CollectorRegistry(), per_thread=per_thread)
    inside, burnt = threading.Event(), threading.Event()

    def call() -> None:
        started = clock.enter()
        inside.set()
        assert burnt.wait(timeout=30)
        clock.leave(started)

    caller = threading.Thread(target=call)
    caller.start()
    assert inside.wait(timeout=30)
    burn(BURN_S)
    burnt.set()
    caller.join()
    return clock.cpu._value.get()


def test_per_thread_counts_only_the_calling_threads_cpu() -> None:
    assert cpu_counted(per_thread=True) < BURN_S / 4


def test_the_process_window_counts_every_thread_during_a_call() -> None:
    assert cpu_counted(per_thread=False) >= BURN_S * 0.9


def test_overlapping_calls_each_count_their_own_cpu() -> None:
    clock = ComputeTime(CollectorRegistry(), per_thread=True)

    def call() -> None:
        started = clock.enter()
        burn(BURN_S / 2)
        clock.leave(started)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.cpu._value.get() >= BURN_S * 0.95


def test_a_call_alone_counts_the_process_cpu_even_per_thread() -> None:
    """A wide session's call computes on onnxruntime's pool threads too: the process's CPU
    during it counts, though the worker counts one-thread calls per thread."""
    clock = ComputeTime(CollectorRegistry(), per_thread=True)
    started = clock.enter(alone=True)
    helper = threading.Thread(target=burn, args=(BURN_S,))
    helper.start()
    helper.join()
    clock.leave(started)
    assert clock.cpu._value.get() >= BURN_S * 0.9
