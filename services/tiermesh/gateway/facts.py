"""What a caller learns about how its request was served: the response parameters of
every door (gRPC, REST) and, when the request is traced, its span's attributes. Pure."""

from __future__ import annotations

from tiermesh.core.jobs import JobResult
from tiermesh.core.model_config import TRUNCATED

# Every response parameter the mesh adds is named `tiermesh.<fact>`, so none can collide with
# a parameter of the caller's own (or Triton's, like `triton_final_response`). The same names
# are the request span's attributes.
RESPONSE_PREFIX = "tiermesh."


def response_facts(
    result: JobResult, responded_ns: int, cache_hit: bool = False
) -> dict[str, float | int | str | bool]:
    """What a caller learns about how its request was served, by response parameter name
    (`tiermesh.queue_ms`, ...; also the request span's attributes)."""
    return {RESPONSE_PREFIX + k: v for k, v in _facts(result, responded_ns, cache_hit).items()}


def _facts(
    result: JobResult, responded_ns: int, cache_hit: bool
) -> dict[str, float | int | str | bool]:
    facts: dict[str, float | int | str | bool] = dict(result.timing.breakdown_ms(responded_ns))
    if cache_hit:
        facts["cache_hit"] = True
    else:
        facts.update(
            batch_size=result.batch_size,
            bucket=result.bucket,
            tier=result.tier,
            worker=result.worker,
        )
    if result.variant:
        facts["variant"] = result.variant
    for key in ("tokens", "padded_tokens"):
        if key in result.annotations:
            facts[key] = int(result.annotations[key])
    for key, kind in GENERATION_FACTS.items():
        if key in result.annotations:
            facts[key] = kind(result.annotations[key])
    if TRUNCATED in result.annotations:
        facts["truncated"] = result.annotations[TRUNCATED] == "true"
    if result.annotations.get("cascaded") == "true":
        facts["cascaded"] = True
        facts["edge_confidence"] = float(result.annotations.get("edge_confidence", "nan"))
    return facts


# What a generative answer tells its caller (worker annotations -> response parameters).
GENERATION_FACTS: dict[str, type[int] | type[float] | type[str]] = {
    "prompt_tokens": int,
    "generated_tokens": int,
    "ttft_ms": float,
    "tpot_ms": float,
    "finish_reason": str,
}
