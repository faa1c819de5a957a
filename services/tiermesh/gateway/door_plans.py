"""The Go front door's placement plans (core/direct_plan.py), as the gateway hands them to
it with a model's config: a text model's plan names its tokenizer.json (checked against
the repository's checksum here, read and checked again by the door), read once per model
version."""

from __future__ import annotations

import json
from typing import Any

import structlog

from tiermesh.core.direct_plan import plan_parameter, text_plan
from tiermesh.core.model_config import ModelConfig, RepositoryError
from tiermesh.core.model_files import sha256_bytes
from tiermesh.core.repository import ModelRepository

log = structlog.get_logger()


class DoorPlans:
    """The plan of each model the door reads; a text model's tokenizer read once a version."""

    def __init__(self, repo: ModelRepository, explicit_control: bool) -> None:
        self._repo = repo
        self._explicit = explicit_control
        self._texts: dict[tuple[str, str], dict[str, Any] | None] = {}

    def parameter(self, cfg: ModelConfig) -> str:
        """The plan as JSON, "" for none (the router places the model's jobs)."""
        text = self._text(cfg) if cfg.tokenize is not None else None
        return plan_parameter(cfg, self._explicit, text)

    def _text(self, cfg: ModelConfig) -> dict[str, Any] | None:
        key = (cfg.name, cfg.version_for(""))
        if key not in self._texts:
            self._texts[key] = self._read(cfg)
        return self._texts[key]

    def _read(self, cfg: ModelConfig) -> dict[str, Any] | None:
        assert cfg.tokenize is not None
        file = cfg.tokenize.tokenizer_file
        try:
            path, data = self._repo.checked_bytes(cfg.name, file, cfg.version_for(""))
            plan = text_plan(cfg, json.loads(data), str(path), sha256_bytes(data))
        except (RepositoryError, OSError, ValueError, KeyError, TypeError) as exc:
            # a tokenizer.json the door cannot use: the router tokenizes this model's texts
            log.warning("the front door cannot tokenize this model", model=cfg.name, error=str(exc))
            return None
        return plan
