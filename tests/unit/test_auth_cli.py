"""`tiermesh keys new`: a fresh key printed once, with a tenants-file entry that accepts it."""

from __future__ import annotations

import pytest

from tiermesh.cli.main import main
from tiermesh.core.tenants import parse_tenants
from tiermesh.gateway.auth import Tenants


def test_keys_new_prints_a_key_and_an_entry_holding_only_its_hash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["keys", "new", "--tenant", "acme"]) == 0
    out = capsys.readouterr().out
    key = out.split("store it now):\n\n  ", 1)[1].split("\n", 1)[0]
    snippet = out[out.index("tenants:") :]
    assert key not in snippet
    (tenant,) = parse_tenants(snippet)
    assert tenant.name == "acme"
    assert Tenants([tenant]).lookup(key) == tenant
    assert main(["keys", "new", "--tenant", "acme"]) == 0
    assert key not in capsys.readouterr().out  # a new key every time


def test_keys_new_refuses_a_name_the_file_would_refuse(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["keys", "new", "--tenant", "a b"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "tenant name" in captured.err
