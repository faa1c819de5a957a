"""The marker of tests that build Go (the front door, the load generator): skipped, with the
way to install it, where Debian's Go toolchain is missing."""

from __future__ import annotations

import pytest

from tiermesh.frontdoor.build import missing_tools

needs_go = pytest.mark.skipif(
    bool(missing_tools()),
    reason="Debian's Go toolchain is not installed (make test installs it: scripts/ensure_go.sh)",
)
