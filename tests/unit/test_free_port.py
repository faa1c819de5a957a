"""free_port: a bindable port outside the kernel's ephemeral range, where outgoing
connections cannot take it between the choice and the bind."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tiermesh.up import processes
from tiermesh.up.processes import LOWEST_PORT, free_port


def test_ports_come_from_below_the_ephemeral_range_and_bind() -> None:
    low = processes._ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= p < low for p in ports), (low, sorted(ports))
    assert len(ports) > 1  # random: concurrent callers rarely meet
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_without_room_below_the_range_the_kernel_picks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    squeezed = tmp_path / "ip_local_port_range"
    squeezed.write_text(f"{LOWEST_PORT + 10}\t60999\n")
    monkeypatch.setattr(processes, "PORT_RANGE_FILE", squeezed)
    assert free_port() >= LOWEST_PORT + 10


def test_a_port_is_handed_out_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal random picks would give two services of one mesh the same port."""
    picks = iter([20_000, 20_000, 20_001])
    monkeypatch.setattr(processes, "_handed_out", set())
    monkeypatch.setattr(processes._ports, "randint", lambda low, high: next(picks))
    assert [free_port(), free_port()] == [20_000, 20_001]
