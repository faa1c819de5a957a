"""`tiermesh up`'s choices that shape the mesh, refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiermesh.up.supervisor import Mesh, StartupError, UpOptions, extra_center_workers


def test_further_center_workers_are_named_after_the_first() -> None:
    assert extra_center_workers(1) == []
    assert extra_center_workers(3) == ["worker-2", "worker-3"]


@pytest.mark.parametrize("raw", ["0", "two", "-1"])
def test_a_bad_center_worker_count_is_refused_before_anything_starts(
    raw: str, tmp_path: Path
) -> None:
    opts = UpOptions(data_dir=tmp_path / "data", extra_env={"TIERMESH_CENTER_WORKERS": raw})
    mesh = Mesh(opts)
    with pytest.raises(StartupError) as refused:
        mesh.start()
    assert str(refused.value) == (f"TIERMESH_CENTER_WORKERS={raw!r}: a whole number of at least 1")
    assert mesh.redis is None and mesh.services == []
    assert not opts.data_dir.exists()
