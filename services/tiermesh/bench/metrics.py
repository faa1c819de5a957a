"""Queue depth over time from the gateway's Prometheus endpoint, when there is one.

The sampler polls `tiermesh_queue_depth` (summed over the streams of the benched model:
every tier, priority, bucket and variant) every interval; the first failure is kept as
the reason shown when no sample came back.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping

QUEUE_DEPTH = "tiermesh_queue_depth"
FETCH_TIMEOUT_S = 1.0
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_gauge(text: str, name: str, match: Mapping[str, str] | None = None) -> float | None:
    """The sum of the samples of metric `name` in Prometheus text format whose labels
    include every pair of `match`; None when there is none."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest[:1] not in ("{", " "):
            continue  # another metric sharing the prefix (e.g. name_bucket)
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            close = rest.rfind("}")
            labels = {k: v for k, v in _LABEL.findall(rest[1:close])}
            rest = rest[close + 1 :]
        if match and any(labels.get(k) != v for k, v in match.items()):
            continue
        fields = rest.split()
        try:
            value = float(fields[0]) if fields else math.nan
        except ValueError:
            continue
        if not math.isnan(value):
            total += value
            found = True
    return total if found else None


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:
        body: bytes = resp.read()
    return body.decode("utf-8", "replace")


class QueueDepthSampler:
    """Started as a task by the session and cancelled by it when the run ends."""

    def __init__(
        self,
        url: str,
        interval_s: float,
        origin: float,
        match: Mapping[str, str] | None = None,
        fetcher: Callable[[str], str] = fetch,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self.origin = origin
        self.match = dict(match or {})
        self.samples: list[tuple[float, float]] = []
        self.error: str = ""
        self._fetch = fetcher
        self._clock = clock

    async def run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self.interval_s)  # a sampling period, not a synchronisation

    async def poll(self) -> None:
        t = self._clock() - self.origin
        try:
            text = await asyncio.to_thread(self._fetch, self.url)
        except (OSError, urllib.error.URLError, ValueError) as exc:
            self.error = self.error or f"{type(exc).__name__}: {exc}"
            return
        value = parse_gauge(text, QUEUE_DEPTH, self.match)
        if value is None:
            which = "".join(f" {k}={v}" for k, v in self.match.items())
            self.error = self.error or f"no {QUEUE_DEPTH}{which} at {self.url}"
            return
        self.samples.append((t, value))
