"""The batch-job caps as pure decisions: a job's budget refuses the chunk (or the input)
that would cross a cap before it is stored, naming the cap; a tenants-file entry overrides
the gateway's defaults cap by cap and refuses keys it does not know."""

from __future__ import annotations

import grpc
import pytest

from tiermesh.batch.limits import BatchCaps, JobBudget, open_jobs_refused
from tiermesh.core.errors import MeshError
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.tenants import TenantsFileError, parse_tenants
from tiermesh.gateway.batch_jobs import DEFAULT_SUBMIT_TIMEOUT_S, caps_of, tenant_caps

ENTRY = (
    "tenants:\n"
    "  - name: acme\n"
    f"    key_sha256: [{'ab' * 32}]\n"
    '    models: "*"\n'
    "    rate: {requests_per_s: 5, burst: 5}\n"
    "    max_in_flight: 4\n"
)


def test_the_settings_defaults_are_the_caps_defaults() -> None:
    settings = GatewaySettings()
    assert caps_of(settings) == BatchCaps() == BatchCaps(8, 100_000, 256 << 20)
    assert settings.batch_submit_timeout_s == DEFAULT_SUBMIT_TIMEOUT_S


def test_the_chunk_that_crosses_the_inputs_cap_is_refused_before_it_is_read() -> None:
    budget = JobBudget(BatchCaps(max_inputs=10))
    budget.count(4)
    budget.count(6)  # exactly at the cap: allowed
    with pytest.raises(MeshError) as err:
        budget.count(1)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "cap of 10 inputs (max_inputs)" in err.value.message
    # Retrying the same job crosses the same cap: no retry-after.
    assert err.value.retry_after_ms is None
    assert budget.inputs == 10  # the refused chunk was not counted


def test_the_input_that_crosses_the_bytes_cap_is_refused() -> None:
    budget = JobBudget(BatchCaps(max_bytes=100))
    budget.store(60)
    budget.store(40)
    with pytest.raises(MeshError) as err:
        budget.store(1)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "cap of 100 bytes (max_bytes)" in err.value.message
    assert budget.bytes == 100


def test_the_open_jobs_refusal_names_the_cap_and_says_when_to_retry() -> None:
    err = open_jobs_refused("acme", 8)
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant 'acme' has 8 unfinished batch jobs" in err.message
    assert "(max_open_jobs)" in err.message
    assert err.retry_after_ms is not None and err.retry_after_ms > 0
    assert "this port's caller" in open_jobs_refused("", 8).message


def test_a_tenant_overrides_the_defaults_cap_by_cap() -> None:
    (plain,) = parse_tenants(ENTRY)
    defaults = BatchCaps(3, 30, 300)
    assert tenant_caps(defaults, plain) == defaults
    assert tenant_caps(defaults, None) == defaults
    (own,) = parse_tenants(ENTRY + "    batch: {max_open_jobs: 2, max_bytes: 1048576}\n")
    assert tenant_caps(defaults, own) == BatchCaps(2, 30, 1 << 20)


@pytest.mark.parametrize(
    ("batch", "problem"),
    [
        ("{max_jobs: 2}", "tenants.0.batch.max_jobs: Extra inputs are not permitted"),
        ("{max_inputs: 0}", "tenants.0.batch.max_inputs: Input should be greater than"),
        ("{max_bytes: lots}", "tenants.0.batch.max_bytes: Input should be a valid integer"),
    ],
)
def test_a_bad_batch_entry_stops_the_start_naming_it(batch: str, problem: str) -> None:
    with pytest.raises(TenantsFileError) as err:
        parse_tenants(ENTRY + f"    batch: {batch}\n")
    assert problem in str(err.value)
