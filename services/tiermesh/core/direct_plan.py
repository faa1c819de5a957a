"""Where the Go front door may place a model's jobs itself, without the router: a plan the
gateway hands the door with the model's config (the `tiermesh.direct` parameter of
ModelConfig, as JSON). Pure: decided here from the config alone, in Python, with the same
functions the router places by; the door only looks the stream up and calls the admission
script (core/admission_script.py) with what the plan names.

Only a model whose placement needs no decision beyond its stream and tier gets one: no
input processing but a text the door tokenizes as the router would (`text_plan`: a
BERT-style WordPiece tokenizer; the door does it for ASCII texts), no prompts, no cascade,
not under explicit model control (a version may be unloaded while workers still drain it).
A tiered model's plan has a placement per tier, lightest first: the door queues a job on the
tier router/tiers.py's choose_tier would pick were every backlog to meet its deadline (by
the job's cost, `max_cost`, among the tiers with live workers as the door last read them);
the admission script then refuses it as `late` when that tier's backlog cannot drain in
time, or `noworker`, and the router, which reads every tier's backlog, decides again (the
spill-over to another tier is the router's). A rollout is checked in Redis, job by job: the
plan's guard key is the model's rollout record, and while one exists the script answers
`reroute` and the router places the job (the rollout's split, mirrors and promoted version
are the router's). Any other outcome than queued goes to the router too, which decides again
and words the refusal, so the door never words one itself.
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
from tiermesh.core.model_config import TOKEN_IDS, TOKEN_MASK, TRUNCATED, ModelConfig
from tiermesh.core.tier_spec import TierSpec

PARAMETER = "tiermesh.direct"


def text_plan(
    cfg: ModelConfig, tokenizer: dict[str, Any], file: str, sha256: str
) -> dict[str, Any] | None:
    """How the door may tokenize `cfg`'s text as core/text.py does, from the model's
    tokenizer.json (`tokenizer`, read from `file` with digest `sha256`), or None when it has
    a shape the door does not do: the door knows a BertNormalizer that cleans the text, a
    BertPreTokenizer, WordPiece and a [CLS] text [SEP] template, with special tokens
    matched in the raw text."""
    spec = cfg.tokenize
    if spec is None or len(cfg.inputs) != 1:
        return None
    normalizer = tokenizer.get("normalizer") or {}
    model = tokenizer.get("model") or {}
    added = tokenizer.get("added_tokens") or []
    first_last = _single_template(tokenizer.get("post_processor") or {})
    if (
        normalizer.get("type") != "BertNormalizer"
        or not normalizer.get("clean_text")
        or (tokenizer.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer"
        or model.get("type") != "WordPiece"
        or not model.get("continuing_subword_prefix")
        or first_last is None
        or any(
            t.get("normalized") or t.get("lstrip") or t.get("rstrip") or t.get("single_word")
            for t in added
        )
    ):
        return None
    return {
        "file": file,
        "sha256": sha256,
        "max_length": spec.max_length,
        "lowercase": bool(normalizer.get("lowercase")),
        "prefix": model["continuing_subword_prefix"],
        "unk_token": model.get("unk_token", "[UNK]"),
        "max_input_chars_per_word": int(model.get("max_input_chars_per_word") or 0),
        "first": first_last[0],
        "last": first_last[1],
        "added": [{"content": t["content"], "id": t["id"]} for t in added],
        "input": cfg.inputs[0].name,
        "ids": TOKEN_IDS,
        "mask": TOKEN_MASK,
        "truncated": TRUNCATED,
    }


def _single_template(post: dict[str, Any]) -> tuple[int, int] | None:
    """The ids before and after a single text, for [CLS] text [SEP] templates only."""
    if post.get("type") == "BertProcessing":
        return int(post["cls"][1]), int(post["sep"][1])
    if post.get("type") != "TemplateProcessing":
        return None
    single = post.get("single") or []
    specials = post.get("special_tokens") or {}
    if (
        len(single) != 3
        or "SpecialToken" not in single[0]
        or single[1].get("Sequence", {}).get("id") != "A"
        or "SpecialToken" not in single[2]
    ):
        return None
    ids = []
    for part in (single[0], single[2]):
        found = specials.get(part["SpecialToken"]["id"], {}).get("ids") or []
        if len(found) != 1:
            return None
        ids.append(int(found[0]))
    return ids[0], ids[1]


def direct_plan(
    cfg: ModelConfig, explicit_control: bool, text: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The plan for `cfg`'s jobs that name no version (or its stable one), or None when the
    router must place them. `tiers` holds one placement per tier, lightest first (one, the
    default tier, for a model without tiers); a placement's `streams[p - 1][b]` is the
    stream of priority level p and length bucket b. A job's bucket is the first whose bound
    is at least its length (its longest dimension over all inputs, the batch dimension left
    out when `batched`), the last bucket for anything longer, as router/policy.py's
    choose_stream; its cost is its rows times that length (policy.py's job_cost)."""
    if (
        explicit_control
        or (cfg.tokenize is not None and text is None)
        or cfg.generation is not None
        or cfg.cascade is not None
    ):
        return None
    version = cfg.version_for("")
    return {
        "version": version,
        "default_priority": cfg.default_priority,
        "bounds": list(cfg.length_buckets),
        "batched": cfg.max_batch_size > 0,
        "tiers": [_placement(cfg, version, t) for t in cfg.served_tiers],
        "rate_fields": [keys.rate_field(b) for b in range(cfg.bucket_count)],
        "queue_bound": cfg.queue_bound,
        "model_bound": cfg.model_queue_bound,
        "enqueued_prefix": keys.enqueued_key(cfg.queue_model, ""),
        "guard": keys.rollout_key(cfg.queue_model),
        "fields": [keys.JOB_FIELD, keys.TRACEPARENT_FIELD, keys.TRACESTATE_FIELD],
        # The door runs it by its SHA1 and loads it into a Redis that lacks it.
        "script": ADMISSION_SCRIPT,
        "remember_margin_ms": REMEMBER_MARGIN_MS,
        "remember_no_deadline_ms": REMEMBER_NO_DEADLINE_MS,
        "text": text if cfg.tokenize is not None else None,
    }


def _placement(cfg: ModelConfig, version: str, tier: TierSpec) -> dict[str, Any]:
    """Where a job placed on `tier` goes: its streams by level and bucket, the tier's
    workers and rate keys, the streams of the model-wide bound."""
    variant = cfg.variant_for("", tier)
    unit = cfg.unit(version, variant)
    streams = keys.stream_keys(unit, tier.name, cfg.priority_levels, cfg.bucket_count)
    return {
        "name": tier.name,
        "max_cost": tier.max_cost,
        "variant": variant,
        "streams": [
            [s.name for s in streams if s.priority == p] for p in range(1, cfg.priority_levels + 1)
        ],
        "workers": keys.workers_key(unit, tier.name),
        "rate": keys.rate_key(unit, tier.name),
        "model_streams": [s.name for s in streams] if cfg.model_queue_bound > 0 else [],
    }


def plan_parameter(
    cfg: ModelConfig, explicit_control: bool, text: dict[str, Any] | None = None
) -> str:
    """The plan as the ModelConfig parameter's JSON; "" for none."""
    plan = direct_plan(cfg, explicit_control, text)
    return "" if plan is None else json.dumps(plan, separators=(",", ":"))
