"""The response parameters the README documents are the ones the gateway sends: every name,
its type and when it is sent (tests/e2e/test_default_mesh_e2e.py reads them off real
responses)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.documented_parameters import documented, documented_for, undocumented_mentions
from tiermesh.core.jobs import JobResult, Timing
from tiermesh.gateway.converters import infer_response

COMPUTED = Timing(
    received_ns=1_000_000,
    enqueued_ns=2_000_000,
    dequeued_ns=3_000_000,
    batch_start_ns=4_000_000,
    batch_end_ns=5_000_000,
    postprocessed_ns=6_000_000,
    delivered_ns=7_000_000,
)
SERVED: dict[str, Any] = dict(
    variant="fp32", tier="edge", bucket=1, batch_size=4, worker="w-1", timing=COMPUTED
)
TEXT = {"tokens": "12", "padded_tokens": "16", "truncated": "false"}
CASCADE = {"cascaded": "true", "edge_confidence": "0.57"}
GENERATIVE = {
    "prompt_tokens": "31",
    "generated_tokens": "3",
    "ttft_ms": "12.5",
    "tpot_ms": "20.25",
    "finish_reason": "stop",
}
# situation -> (the result the gateway answers with, the table's "when" values that apply)
CASES: dict[str, tuple[JobResult, tuple[str, ...]]] = {
    "computed": (JobResult("r", "mlp", "g", **SERVED), ("always", "computed")),
    "text": (
        JobResult("r", "minilm-l6", "g", annotations=TEXT, **SERVED),
        ("always", "computed", "text"),
    ),
    "cascade": (
        JobResult("r", "mlp_cascade", "g", annotations=CASCADE, **SERVED),
        ("always", "computed", "cascade"),
    ),
    "generative": (
        JobResult("r", "smollm2", "g", annotations=GENERATIVE, **SERVED),
        ("always", "computed", "generative"),
    ),
}
KINDS = {"double_param": "double", "int64_param": "int64", "string_param": "string"}


def _sent(result: JobResult, cache_hit: bool = False) -> dict[str, str]:
    """Each parameter of the gRPC response -> its type as the README's table spells it."""
    params = infer_response(result, 8_000_000, cache_hit).parameters
    out = {}
    for name, param in params.items():
        which = param.WhichOneof("parameter_choice")
        out[name] = KINDS.get(which, "bool")
    return out


def test_the_docs_mention_only_documented_parameters() -> None:
    assert undocumented_mentions() == []


@pytest.mark.parametrize("case", CASES)
def test_each_situation_sends_what_the_table_says(case: str) -> None:
    result, whens = CASES[case]
    sent = _sent(result)
    assert set(sent) == documented_for(*whens)
    table = documented()
    assert {name: table[name][0] for name in sent} == sent


def test_a_cache_hit_sends_its_flag_and_no_computed_facts() -> None:
    result = JobResult("r", "mlp_cached", "g", variant="fp32", timing=Timing(received_ns=1))
    assert set(_sent(result, cache_hit=True)) == documented_for("always", "cache hit")


def test_every_documented_parameter_is_sent_somewhere() -> None:
    sent = set().union(*(_sent(result) for result, _ in CASES.values()))
    hit = JobResult("r", "mlp_cached", "g", timing=Timing(received_ns=1))
    sent |= set(_sent(hit, cache_hit=True))
    assert sent == set(documented())
    assert all(name.startswith("tiermesh.") for name in sent)
