"""Entries of the change log (core/keys.CHANGE_LOG): who changed which version of which
model how, when, and the checksum of the version's files."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields

from tiermesh.core.model_config import ModelConfig
from tiermesh.rollout.state import RolloutState


@dataclass(frozen=True, slots=True)
class Change:
    time_ms: int
    who: str
    action: str  # start | promote | rollback | auto-rollback
    model: str
    stable: str
    canary: str
    percent: float
    state: str
    # sha256 over the config's per-file checksums of the canary (and stable) version.
    canary_sha256: str = ""
    stable_sha256: str = ""
    reason: str = ""
    detail: str = ""
    entry_id: str = ""  # the stream entry's id, once read back

    def to_fields(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items() if k != "entry_id"}

    @classmethod
    def from_fields(cls, entry_id: str, raw: dict[str, str]) -> Change:
        known = {f.name for f in fields(cls)} - {"entry_id", "time_ms", "percent"}
        return cls(
            time_ms=int(raw.get("time_ms", "0")),
            percent=float(raw.get("percent", "0")),
            entry_id=entry_id,
            **{k: v for k, v in raw.items() if k in known},
        )


def version_checksum(cfg: ModelConfig, version: str) -> str:
    """sha256 of the version's "file sha256" lines as the config lists them, sorted: one
    value that changes whenever any file of the version does. ("provenance" entries stand
    for checksums recorded at fetch time; they are hashed as written.)"""
    ver = cfg.version(version)
    if ver is None or not version:
        return ""
    lines = "".join(f"{name} {digest}\n" for name, digest in sorted(ver.files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def change_of(
    cfg: ModelConfig,
    new: RolloutState,
    action: str,
    who: str,
    reason: str = "",
    detail: str = "",
) -> Change:
    return Change(
        time_ms=new.updated_ms,
        who=who,
        action=action,
        model=new.model,
        stable=new.stable,
        canary=new.canary,
        percent=new.percent,
        state=new.state,
        canary_sha256=version_checksum(cfg, new.canary),
        stable_sha256=version_checksum(cfg, new.stable),
        reason=reason,
        detail=detail,
    )
