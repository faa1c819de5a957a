"""Closed-loop load on a `tiermesh up` for the fault tests: a few callers in a thread of
their own, each call recorded with when it started, when it ended and how."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Self

import numpy as np
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException


@dataclass(frozen=True, slots=True)
class Call:
    start: float  # time.monotonic()
    end: float
    code: str  # "OK" or the status code's name

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Callers:
    """Closed-loop callers sharing one client, in a thread of their own, from `with` until
    its end; subclasses say what one caller does (`_caller`, looping until `_stop`)."""

    url: str
    callers: int = 8
    timeout_s: float = 15.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 30)
            assert not self._thread.is_alive(), "a caller never returned"

    async def _run(self) -> None:
        client = aioclient.InferenceServerClient(self.url)
        try:
            await asyncio.gather(*(self._caller(client, i) for i in range(self.callers)))
        finally:
            await client.close()

    async def _caller(self, client: aioclient.InferenceServerClient, index: int) -> None:
        raise NotImplementedError


@dataclass
class Load(Callers):
    """mlp requests with random inputs, each call's outcome recorded."""

    calls: list[Call] = field(default_factory=list)

    def wait_for(self, n: int, timeout_s: float = 60, code: str = "OK", after: float = 0) -> float:
        """Block until `n` calls that started after `after` ended with `code`; returns the
        end of the n-th (monotonic)."""
        deadline = time.monotonic() + timeout_s
        while True:
            ends = sorted(c.end for c in list(self.calls) if c.code == code and c.start >= after)
            if len(ends) >= n:
                return ends[n - 1]
            assert time.monotonic() < deadline, (
                f"only {len(ends)} {code} calls within {timeout_s}s: {self.codes()}"
            )
            time.sleep(0.02)

    def codes(self) -> Counter[str]:
        return Counter(c.code for c in list(self.calls))

    async def _caller(self, client: aioclient.InferenceServerClient, index: int) -> None:
        rng = np.random.default_rng(index)
        while not self._stop.is_set():
            inp = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(rng.standard_normal((1, 4)).astype(np.float32))
            start = time.monotonic()
            try:
                await client.infer(
                    "mlp",
                    [inp],
                    timeout=int(self.timeout_s * 1e6),
                    client_timeout=self.timeout_s + 5,
                )
                code = "OK"
            except InferenceServerException as exc:
                code = str(exc.status()).removeprefix("StatusCode.")
            self.calls.append(Call(start, time.monotonic(), code))
            if code == "UNAVAILABLE":  # what a polite client does: back off a little
                await asyncio.sleep(0.02)
