"""The default mesh (`tiermesh up`: the Go front door, gateway, router, worker, postprocess)
on a real local Redis Cluster of three primaries with a replica each, instead of its private
redis-server: requests answered, and a primary killed under load (its replica promoted)
loses no request the mesh had accepted. The e2e suites run whole on a cluster with
TIERMESH_TEST_REDIS=cluster (tests/e2e/conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import UpProcess, gateway_counts, stop_counts
from tests.e2e.load import Load
from tests.e2e.test_faults_e2e import FAST_RECOVERY, report
from tests.redis_cluster import LocalCluster
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.redis_client import connect_sync

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of this test's own: the test kills one of its primaries."""
    started = LocalCluster(tmp_path / "cluster")
    try:
        yield started.start()
    finally:
        started.stop()


def test_a_primary_failed_over_under_load_loses_no_accepted_request(
    new_up: Callable[..., UpProcess], cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL the primary holding mlp's streams while 8 callers send: calls meanwhile are
    refused UNAVAILABLE at once (or answered), the replica takes over the slots, every
    service finds it by itself, and every request the mesh had accepted is answered: an
    accepted job was on the replica before the router said so (WAIT)."""
    up = new_up(extra_env={**FAST_RECOVERY, "TIERMESH_REDIS_URL": cluster.url})
    stream = StreamKey(ComputeUnit("mlp", "1", "fp32"), "center", 1, 0).name
    spread = connect_sync(up.redis_url())
    try:  # the mesh's keys are spread over the primaries, not all on one
        placed = {cluster.primary_of(k.decode()).port for k in spread.scan_iter(count=1000)}
    finally:
        spread.close()
    assert len(placed) >= 2, placed
    timeout_s = 10.0
    with Load(up.url, callers=8, timeout_s=timeout_s) as load:
        load.wait_for(50)
        struck = time.monotonic()
        killed, promoted = cluster.fail_over(stream)
        promoted_s = time.monotonic() - struck
        recovered_s = load.wait_for(1, after=struck + promoted_s) - struck
        load.wait_for(50, after=struck + promoted_s)
    assert up.interrupt() == 0
    stops = stop_counts(up)
    unavailable = sorted(c.seconds for c in load.calls if c.code == "UNAVAILABLE")
    during = [c for c in load.calls if struck <= c.start <= struck + promoted_s]
    with capsys.disabled():
        print(report("SIGKILL a Redis Cluster primary", load, stops, recovered_s), end="")
        print(
            f", replica {promoted.address} promoted after {promoted_s:.2f} s "
            f"(killed {killed.address}), calls started meanwhile {len(during)} "
            f"({sum(c.code == 'OK' for c in during)} OK), slowest call "
            f"{max(c.seconds for c in load.calls):.2f} s"
            + (
                f", UNAVAILABLE answered in at most {unavailable[-1] * 1000:.0f} ms"
                if unavailable
                else ""
            )
        )
    # Every call ended within its deadline with a documented code ...
    assert set(load.codes()) <= {"OK", "UNAVAILABLE"}, load.codes()
    assert max(c.seconds for c in load.calls) < timeout_s + 1
    # ... and nothing the mesh had accepted was lost.
    counts = gateway_counts(up)
    assert counts["accepted"] == counts["answered"] == load.codes()["OK"]
