"""Where the Go front door may place a model's jobs itself, without the router: a plan the
gateway hands the door with the model's config (the `tiermesh.direct` parameter of
ModelConfig, as JSON). Pure: decided here from the config alone, in Python, with the same
functions the router places by; the door only looks the stream up and calls the admission
script (core/admission_script.py) with what the plan names.

Only a model whose placement needs no decision beyond its stream gets one: no input
processing (text, prompts), no tiers (the tier choice reads live backlogs), no cascade, not
under explicit model control (a version may be unloaded while workers still drain it). A
rollout is checked in Redis, job by job: the plan's guard key is the model's rollout
record, and while one exists the script answers `reroute` and the router places the job
(the rollout's split, mirrors and promoted version are the router's). Any other outcome
than queued goes to the router too, which decides again and words the refusal, so the door
never words one itself.
"""

from __future__ import annotations

import json
from typing import Any

from tiermesh.core import keys
from tiermesh.core.admission_script import (
    ADMISSION_SCRIPT,
    REMEMBER_MARGIN_MS,
    REMEMBER_NO_DEADLINE_MS,
)
from tiermesh.core.model_config import ModelConfig

PARAMETER = "tiermesh.direct"


def direct_plan(cfg: ModelConfig, explicit_control: bool) -> dict[str, Any] | None:
    """The plan for `cfg`'s jobs that name no version (or its stable one), or None when the
    router must place them. `streams[p - 1][b]` is the stream of priority level p and
    length bucket b; a job's bucket is the first whose bound is at least its length (its
    longest dimension over all inputs, the batch dimension left out when `batched`), the
    last bucket for anything longer, as router/policy.py's choose_stream."""
    if (
        explicit_control
        or cfg.tokenize is not None
        or cfg.generation is not None
        or cfg.tiers
        or cfg.cascade is not None
    ):
        return None
    version = cfg.stable.version
    unit = keys.compute_unit(cfg.queue_model, cfg.default_variant, version)
    streams = keys.stream_keys(unit, keys.DEFAULT_TIER, cfg.priority_levels, cfg.bucket_count)
    by_level = [
        [s.name for s in streams if s.priority == p] for p in range(1, cfg.priority_levels + 1)
    ]
    return {
        "version": version,
        "variant": cfg.default_variant,
        "tier": keys.DEFAULT_TIER,
        "default_priority": cfg.default_priority,
        "bounds": list(cfg.length_buckets),
        "batched": cfg.max_batch_size > 0,
        "streams": by_level,
        "rate_fields": [keys.rate_field(b) for b in range(cfg.bucket_count)],
        "workers": keys.workers_key(unit, keys.DEFAULT_TIER),
        "rate": keys.rate_key(unit, keys.DEFAULT_TIER),
        "queue_bound": cfg.queue_bound,
        "model_bound": cfg.model_queue_bound,
        "model_streams": [s.name for s in streams] if cfg.model_queue_bound > 0 else [],
        "enqueued_prefix": keys.enqueued_key(""),
        "guard": keys.rollout_key(cfg.queue_model),
        "fields": [keys.JOB_FIELD, keys.TRACEPARENT_FIELD, keys.TRACESTATE_FIELD],
        # The door runs it by its SHA1 and loads it into a Redis that lacks it.
        "script": ADMISSION_SCRIPT,
        "remember_margin_ms": REMEMBER_MARGIN_MS,
        "remember_no_deadline_ms": REMEMBER_NO_DEADLINE_MS,
    }


def plan_parameter(cfg: ModelConfig, explicit_control: bool) -> str:
    """The plan as the ModelConfig parameter's JSON; "" for none."""
    plan = direct_plan(cfg, explicit_control)
    return "" if plan is None else json.dumps(plan, separators=(",", ":"))
