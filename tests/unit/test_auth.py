"""API keys -> tenant -> allowed models: the tenants file, key lookup and the decisions."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import grpc
import pytest

from tiermesh.core.tenants import (
    Tenant,
    TenantsFileError,
    hash_key,
    load_tenants,
    new_key,
    parse_tenants,
    tenant_snippet,
)
from tiermesh.gateway import auth
from tiermesh.gateway.auth import AuthRefused, Tenants, authenticate, authorize, presented_key

ACME_KEY = "acme-key-0123456789"
ACME_OLD_KEY = "acme-old-key"
GLOBEX_KEY = "globex-key-abcdef"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


FILE = f"""
tenants:
  - name: acme
    key_sha256: [{sha(ACME_KEY)}, {sha(ACME_OLD_KEY).upper()}]
    models: [mlp, echo]
    rate: {{requests_per_s: 5, burst: 10}}
    max_in_flight: 4
  - name: globex
    key_sha256: [{sha(GLOBEX_KEY)}]
    models: "*"
    rate: {{requests_per_s: 0.5, burst: 1}}
    max_in_flight: 1
"""


@pytest.fixture
def tenants() -> Tenants:
    return Tenants(parse_tenants(FILE))


def bearer(key: str) -> list[tuple[str, str | bytes]]:
    return [("user-agent", "grpc-python"), ("authorization", f"Bearer {key}")]


def test_file_parses_into_tenants_with_digests_not_keys() -> None:
    acme, globex = parse_tenants(FILE)
    assert acme == Tenant(
        name="acme",
        key_hashes=(hash_key(ACME_KEY), hash_key(ACME_OLD_KEY)),
        models=frozenset({"mlp", "echo"}),
        requests_per_s=5.0,
        burst=10,
        max_in_flight=4,
    )
    assert globex.models is None  # "*": every model
    assert ACME_KEY.encode() not in repr(acme).encode()


def test_lookup_finds_the_tenant_of_each_key_rotated_ones_included(tenants: Tenants) -> None:
    assert tenants.lookup(ACME_KEY).name == "acme"  # type: ignore[union-attr]
    assert tenants.lookup(ACME_OLD_KEY).name == "acme"  # type: ignore[union-attr]
    assert tenants.lookup(GLOBEX_KEY).name == "globex"  # type: ignore[union-attr]
    assert tenants.lookup("nope") is None
    assert tenants.lookup(sha(ACME_KEY)) is None  # the hash is not a key


def test_lookup_compares_with_every_stored_hash_in_constant_time(
    tenants: Tenants, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for key in (ACME_KEY, GLOBEX_KEY, "unknown"):
        calls.clear()
        tenants.lookup(key)
        # All three stored hashes, whichever matched first; always the digest, never the key.
        assert len(calls) == 3
        assert all(a == hash_key(key) for a, _ in calls)


@pytest.mark.parametrize(
    ("metadata", "key"),
    [
        ([("authorization", "Bearer k1")], "k1"),
        ([("authorization", "bearer   k1 ")], "k1"),
        ([("Authorization", "BEARER k1")], "k1"),
        ([("x-api-key", "k2")], "k2"),
        ([("trace-bin", b"\x00"), ("x-api-key", " k2 ")], "k2"),
    ],
)
def test_presented_key_forms(metadata: list[tuple[str, str | bytes]], key: str) -> None:
    assert presented_key(metadata) == key


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ([], auth.MISSING),
        ([("user-agent", "x")], auth.MISSING),
        ([("authorization", "Basic dXNlcjpwYXNz")], auth.MALFORMED),
        ([("authorization", "Bearer ")], auth.MALFORMED),
        ([("authorization", "k1")], auth.MALFORMED),
        ([("x-api-key", "")], auth.MALFORMED),
        ([("authorization", "Bearer k1"), ("x-api-key", "k2")], auth.MALFORMED),
        ([("x-api-key", "k1"), ("x-api-key", "k1")], auth.MALFORMED),
    ],
)
def test_missing_or_malformed_credentials_are_unauthenticated(
    metadata: list[tuple[str, str | bytes]], reason: str
) -> None:
    with pytest.raises(AuthRefused) as err:
        presented_key(metadata)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert err.value.reason == reason


def test_unknown_key_is_unauthenticated_with_the_same_message(tenants: Tenants) -> None:
    with pytest.raises(AuthRefused) as missing:
        authenticate(tenants, [])
    with pytest.raises(AuthRefused) as unknown:
        authenticate(tenants, bearer("guess"))
    assert unknown.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert unknown.value.reason == auth.UNKNOWN
    # Nothing tells a guesser which part was wrong, nor repeats what it sent.
    assert unknown.value.message == missing.value.message
    assert "guess" not in unknown.value.message


def test_allowed_model_decision(tenants: Tenants) -> None:
    assert authorize(tenants, bearer(ACME_KEY), "mlp").name == "acme"
    # A model outside the list is refused whether or not it exists: existence is not leaked.
    for model in ("minilm-l6", "no-such-model", "../mlp"):
        with pytest.raises(AuthRefused) as err:
            authorize(tenants, bearer(ACME_KEY), model)
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert err.value.reason == auth.NOT_ALLOWED
    # "*" allows every name; whether it exists is the repository's question (NOT_FOUND).
    assert authorize(tenants, bearer(GLOBEX_KEY), "no-such-model").name == "globex"
    # Credentials are checked before the model: a bad key never learns about permissions.
    with pytest.raises(AuthRefused) as err:
        authorize(tenants, bearer("guess"), "minilm-l6")
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("tenants: [", "not valid YAML"),
        ("{}", "tenants: Field required"),
        ("tenants: []", "tenants: List should have at least 1 item"),
        (FILE.replace("max_in_flight: 4", "max_in_flight: 0"), "tenants.0.max_in_flight"),
        (FILE.replace("burst: 10", "burst: 10, extra: 1"), "tenants.0.rate.extra"),
        (FILE.replace("requests_per_s: 5,", "requests_per_s: -5,"), "requests_per_s"),
        (FILE.replace("name: globex", "name: acme"), "tenant 'acme' is listed twice"),
        (FILE.replace("name: globex", "name: 'has space'"), "tenants.1.name"),
        (FILE.replace(sha(GLOBEX_KEY), sha(ACME_KEY)), "repeats a key hash"),
        (FILE.replace(sha(GLOBEX_KEY), "plaintext-key"), "tenants.1.key_sha256.0"),
        (FILE.replace('models: "*"', "models: everything"), "tenants.1.models"),
        (FILE.replace("models: [mlp, echo]", "models: []"), "tenants.0.models"),
    ],
)
def test_bad_files_fail_with_a_message_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(TenantsFileError) as err:
        parse_tenants(text, "t.yaml")
    assert str(err.value).startswith("t.yaml: ")
    assert problem in str(err.value)
    # The message never echoes a rejected value (a pasted key would land in the log).
    assert "plaintext-key" not in str(err.value)


def test_load_reports_an_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(TenantsFileError, match="cannot read tenants file"):
        load_tenants(tmp_path / "missing.yaml")
    good = tmp_path / "tenants.yaml"
    good.write_text(FILE)
    assert [t.name for t in load_tenants(good)] == ["acme", "globex"]


def test_new_key_and_its_snippet_make_a_valid_file() -> None:
    key = new_key()
    assert len(key) >= 43 and key != new_key()
    snippet = tenant_snippet("initech", key)
    assert key not in snippet
    (tenant,) = parse_tenants(snippet)
    assert Tenants([tenant]).lookup(key) == tenant
    assert tenant.models is None


def test_statistics_are_for_admins_where_keys_are_on(tenants: Tenants) -> None:
    acme = authenticate(tenants, bearer(ACME_KEY))
    with pytest.raises(AuthRefused) as err:
        auth.check_statistics(acme)
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert err.value.reason == auth.NOT_ADMIN
    auth.check_statistics(Tenant("ops", (), None, 1.0, 1, 1, admin=True))
    auth.check_statistics(None)  # a port without keys: everyone reads them
