"""spawn: a child in a process group of its own (the terminal's Ctrl-C goes to the
supervisor alone) but in the supervisor's session, so that on a kernel with autogroup
scheduling the whole mesh is one CPU group and the nice values its services set rank their
threads against each other's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tiermesh.up.processes import spawn

REPORT = """
import json, os, signal, sys
json.dump({
    "sid": os.getsid(0),
    "pgid": os.getpgid(0),
    "ttou_ignored": signal.getsignal(signal.SIGTTOU) == signal.SIG_IGN,
    "autogroup": open("/proc/self/autogroup").read()
    if os.path.exists("/proc/self/autogroup") else None,
}, open(sys.argv[1], "w"))
"""


def autogroup_id(text: str | None) -> str | None:
    """The autogroup in /proc/PID/autogroup's text: None where the file is missing (a kernel
    without autogroups) or empty (a process whose cpu cgroup is not the root one, as in a
    container: autogroups do not apply there)."""
    words = (text or "").split()
    return words[0] if words else None


def autogroup_of_ours() -> str | None:
    path = Path("/proc/self/autogroup")
    return autogroup_id(path.read_text() if path.exists() else None)


def test_a_child_has_its_own_group_in_our_session(tmp_path: Path) -> None:
    out = tmp_path / "child.json"
    child = spawn([sys.executable, "-c", REPORT, str(out)], os.environ)
    assert child.wait(timeout=30) == 0
    seen = json.loads(out.read_text())
    assert seen["sid"] == os.getsid(0)
    assert seen["pgid"] == child.pid != os.getpgid(0)
    assert seen["ttou_ignored"]
    assert autogroup_id(seen["autogroup"]) == autogroup_of_ours()
