"""Two online workers on the center tier (`up --center-workers 2`): both take from the same
streams, every request is answered once and correctly, and both compute."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from tests.e2e.conftest import UpProcess, running
from tests.e2e.test_requests_e2e import concurrent_mlp_calls, reference

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    with running(
        tmp_path_factory.mktemp("two-workers"),
        extra_env={"TIERMESH_CENTER_WORKERS": "2", "TIERMESH_INTRA_OP_THREADS": "1"},
        span_files=False,
    ) as up:
        yield up


def test_both_center_workers_compute_and_every_answer_is_right(two_workers: UpProcess) -> None:
    rng = np.random.default_rng(5)
    workers: Counter[str] = Counter()
    for _ in range(5):  # rounds of 64 at once: each worker finds a batch waiting
        inputs = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(64)]
        results = concurrent_mlp_calls(two_workers.url, inputs)
        assert [r.get_response().id for r in results] == [f"r{i}" for i in range(64)]
        for result, x in zip(results, inputs, strict=True):
            np.testing.assert_allclose(
                result.as_numpy("OUTPUT0"), reference(two_workers, x), rtol=1e-6
            )
            params = result.get_response().parameters
            assert params["tiermesh.tier"].string_param == "center"
            workers[params["tiermesh.worker"].string_param] += 1
    assert len(workers) == 2, workers
    assert min(workers.values()) > 0
    assert two_workers.interrupt() == 0
    assert two_workers.log.read_text().count('"event": "worker stopped"') == 2
