"""The model repository: ``models/<name>/config.yaml`` and ``models/<name>/<version>/<file>``.

Configs are committed; weights are built or fetched and checked against the sha256 in the
config before any service uses them. A mismatch refuses to load with a clear error.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog
import yaml

from tiermesh.core.gates import GateRecord, GateVerdict, Standing, judge, read_records
from tiermesh.core.model_config import (
    ModelConfig,
    ModelVersion,
    RepositoryError,
    TensorSpec,
    companions,
    parse_config,
)
from tiermesh.core.model_files import (
    VerifiedModel,
    check_external,
    check_file,
    existing_file,
    external_locations,
    inside,
    plain_relative,
    read_checked,
)

__all__ = [
    "ModelConfig",
    "ModelRepository",
    "ModelVersion",
    "RepositoryError",
    "TensorSpec",
    "VerifiedModel",
    "parse_config",
    "sha256_file",
]

log = structlog.get_logger("tiermesh.repository")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class ModelRepository:
    """Reads model configs and hands out checked model files. Built once per service."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._configs: dict[str, ModelConfig] = {}
        self._verdicts: dict[str, dict[str, dict[str, GateVerdict]]] = {}

    def load(self) -> dict[str, ModelConfig]:
        """Read every models/<name>/config.yaml (and its companions); called once at start."""
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {self.root} does not exist")
        configs: dict[str, ModelConfig] = {}
        for path in sorted(self.root.glob("*/config.yaml")):
            try:
                raw = yaml.safe_load(path.read_text())
            except yaml.YAMLError as exc:
                raise RepositoryError(f"{path}: not valid YAML: {exc}") from exc
            cfg = parse_config(with_built_variants(raw, path.parent), str(path))
            if cfg.name != path.parent.name:
                raise RepositoryError(f"{path}: name {cfg.name!r} != folder {path.parent.name!r}")
            cfg = self._gated(cfg, path)
            for model in (cfg, *companions(raw, cfg, str(path))):
                if model.name in configs:
                    raise RepositoryError(f"{path}: model {model.name!r} defined twice")
                configs[model.name] = model
        self._configs = configs
        return configs

    def _gated(self, cfg: ModelConfig, path: Path) -> ModelConfig:
        """`cfg` with the variants each version may serve (core/gates.py); a default or tier
        variant that cannot serve in every version falls back to the reference, logged."""
        verdicts = {
            ver.version: judge(
                cfg.variants,
                cfg.reference_variant,
                self._records(cfg, ver, path),
                functools.partial(self._recorded_sha256, cfg, ver),
                cfg.ungated,
            )
            for ver in cfg.versions
        }
        self._verdicts[cfg.name] = verdicts
        servable = {
            version: frozenset(v for v, verdict in each.items() if verdict.standing.serves)
            for version, each in verdicts.items()
        }
        everywhere = frozenset.intersection(*servable.values())
        reference = cfg.reference_variant
        for version, each in verdicts.items():
            for verdict in each.values():
                if verdict.standing is Standing.UNGATED:
                    log.warning(
                        "variant served without a passing gate record (ungated: true)",
                        model=cfg.name,
                        version=version,
                        variant=verdict.variant,
                        why=verdict.why,
                    )
        default = cfg.default_variant
        if default not in everywhere:
            log.warning(
                "default variant has no passing gate record; the reference serves instead",
                model=cfg.name,
                variant=default,
                reference=reference,
            )
            default = reference
        tiers = []
        for tier in cfg.tiers:
            if tier.variant and tier.variant not in everywhere:
                log.warning(
                    "tier variant has no passing gate record; the reference serves instead",
                    model=cfg.name,
                    tier=tier.name,
                    variant=tier.variant,
                    reference=reference,
                )
                tier = replace(tier, variant=reference)
            tiers.append(tier)
        return replace(cfg, servable=servable, default_variant=default, tiers=tuple(tiers))

    def _records(self, cfg: ModelConfig, ver: ModelVersion, path: Path) -> dict[str, GateRecord]:
        folder = self.root / cfg.queue_model / ver.version
        try:
            return read_records(folder)
        except ValueError as exc:
            raise RepositoryError(f"{path}: {exc}") from None

    def _recorded_sha256(self, cfg: ModelConfig, ver: ModelVersion, file: str) -> str:
        """The checksum the repository holds `file` to; "" when unknown (not fetched)."""
        expected = ver.files.get(file, "")
        if expected != PROVENANCE:
            return expected
        folder = self.root / cfg.queue_model / ver.version
        try:
            return _provenance_files(self.root, folder).get(file, "")
        except RepositoryError:
            return ""

    def verdicts(self, name: str) -> dict[str, dict[str, GateVerdict]]:
        """version -> variant -> its gate standing, as load() judged it."""
        return self._verdicts[self._configs[name].queue_model]

    @property
    def configs(self) -> dict[str, ModelConfig]:
        return self._configs

    def get(self, name: str) -> ModelConfig | None:
        return self._configs.get(name)

    def checked_folder(self, name: str, version: str = "") -> Path:
        """The version folder of (name, version) after every file in it matched its sha256.

        A checksum of ``provenance`` in the config stands for the one recorded in the
        folder's provenance.yaml by `tiermesh models fetch` (files built on this machine,
        such as INT8 quantizations, whose bytes depend on the installed onnxruntime).
        Raises RepositoryError naming the file, the expected and the actual digest; also
        for a file named with '..' or an absolute path, or reached through a symlink that
        leads out of the repository (see core/model_files.py).
        """
        folder, _ = self._verify(name, version, keep=())
        return folder

    def checked_files(self, name: str, files: Sequence[str], version: str = "") -> Path:
        """The version folder of (name, version) after those of `files` the version lists
        matched their sha256: for a service that reads only those (the router reads a
        tokenizer, not the weights beside it). Raises RepositoryError like checked_folder."""
        folder, _ = self._verify(name, version, keep=(), only=tuple(files))
        return folder

    def checked_bytes(self, name: str, file: str, version: str = "") -> tuple[Path, bytes]:
        """One file of (name, version) as bytes that matched its sha256, read once, and its
        path. Raises RepositoryError like checked_folder."""
        folder, kept = self._verify(name, version, keep=(file,), only=(file,))
        if file not in kept:
            raise RepositoryError(f"model {name!r}: {file} is not among its version's files")
        return folder / file, kept[file]

    def verified_model(self, name: str, version: str = "", variant: str = "") -> VerifiedModel:
        """The model file of (name, version, variant) as verified bytes, with the bytes of
        the ONNX external data it refers to: what an onnxruntime session is built from.

        Called right before a session is created: every file of the version is checked
        (sha256, no way out of the repository), the model and its external data are read
        once and the session gets those bytes, so nothing changed on disk afterwards can
        reach it. External data must stay inside the version folder and be one of the
        version's checksummed files.
        """
        cfg, ver = self._config(name, version)
        variant = cfg.variant_for(variant)
        if variant not in cfg.variants:
            raise RepositoryError(f"model {name!r} has no variant {variant!r}")
        file = cfg.variants[variant]
        folder, data = self._verify(name, version, keep=(file,))
        path = folder / file
        external: dict[str, bytes] = {}
        for location in external_locations(data[file], path):
            rel = str(check_external(folder, location, path))
            if rel not in ver.files:
                raise RepositoryError(
                    f"{path}: external data {location!r} has no recorded sha256 in the "
                    f"config of {name!r} version {ver.version}; refusing to load"
                )
            if rel not in data:  # checked above; read again to keep the bytes
                expected = _expected(self.root, folder, ver, rel)
                data[rel] = read_checked(self.root, folder / rel, expected)
            external[location] = data[rel]
        return VerifiedModel(path, data[file], external)

    def _config(self, name: str, version: str) -> tuple[ModelConfig, ModelVersion]:
        cfg = self._configs.get(name)
        if cfg is None:
            raise RepositoryError(f"unknown model {name!r}")
        ver = cfg.version(version)
        if ver is None:
            raise RepositoryError(f"model {name!r} has no version {version!r}")
        return cfg, ver

    def _verify(
        self, name: str, version: str, keep: tuple[str, ...], only: tuple[str, ...] = ()
    ) -> tuple[Path, dict[str, bytes]]:
        """Check every file of (name, version), or those in `only`; return its folder and
        the bytes of `keep`."""
        cfg, ver = self._config(name, version)
        where = f"model {name!r} version {ver.version}"
        plain_relative(cfg.queue_model, where)
        plain_relative(ver.version, where)
        folder = self.root / cfg.queue_model / ver.version
        recorded: dict[str, str] | None = None
        kept: dict[str, bytes] = {}
        for file, expected in ver.files.items():
            if only and file not in only:
                continue
            plain_relative(file, where)
            existing_file(self.root, folder / file)  # a missing file says so first
            if expected == PROVENANCE:
                recorded = (
                    recorded if recorded is not None else _provenance_files(self.root, folder)
                )
                expected = recorded.get(file, "")
            if file in keep:
                kept[file] = read_checked(self.root, folder / file, expected)
            else:
                check_file(self.root, folder / file, expected)
        return folder, kept

    def preoptimized(self, name: str, variant: str, version: str = "") -> bool:
        """Whether `tiermesh optimize` saved this variant after graph optimisation."""
        cfg = self._configs[name]
        ver = cfg.version(version)
        if ver is None:
            return False
        path = self.root / cfg.queue_model / ver.version / "provenance.yaml"
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            return False
        return bool(((raw.get("optimize") or {}).get(variant) or {}).get("preoptimized"))

    def checked_file(self, name: str, version: str = "", variant: str = "") -> Path:
        """The model file of (name, version, variant) after the folder's checksums matched."""
        folder = self.checked_folder(name, version)
        cfg = self._configs[name]
        variant = cfg.variant_for(variant)
        if variant not in cfg.variants:
            raise RepositoryError(f"model {name!r} has no variant {variant!r}")
        return folder / cfg.variants[variant]


PROVENANCE = "provenance"
# Written by `tiermesh optimize` into a version folder: variant name -> file, for variants
# built on this machine (their checksums are in the folder's provenance.yaml).
BUILT_VARIANTS = "variants.yaml"


def with_built_variants(raw: Any, model_dir: Path) -> Any:
    """The config with the variants `tiermesh optimize` wrote into its version folders."""
    if not isinstance(raw, dict) or not isinstance(raw.get("versions"), dict):
        return raw
    merged = dict(raw)
    variants = dict(merged.get("variants") or {"fp32": merged.get("model_file", "model.onnx")})
    versions = {v: dict(files or {}) for v, files in merged["versions"].items()}
    for version, files in versions.items():
        path = model_dir / str(version) / BUILT_VARIANTS
        if not path.is_file():
            continue
        try:
            built = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise RepositoryError(f"{path}: not valid YAML: {exc}") from exc
        for variant, file in dict(built).items():
            if str(variant) in variants:
                continue  # the committed config wins
            variants[str(variant)] = str(file)
            files.setdefault(str(file), PROVENANCE)
    merged["variants"] = variants
    merged["versions"] = versions
    return merged


def _expected(root: Path, folder: Path, ver: ModelVersion, file: str) -> str:
    """The sha256 recorded for `file` (from provenance.yaml when the config says so)."""
    expected = ver.files[file]
    return _provenance_files(root, folder).get(file, "") if expected == PROVENANCE else expected


def _provenance_files(root: Path, folder: Path) -> dict[str, str]:
    path = folder / "provenance.yaml"
    # The recorded checksums are only as trustworthy as the file: it must be the repository's.
    inside(root, path)
    try:
        raw = yaml.safe_load(path.read_text())
        return {str(k): str(v) for k, v in raw["files"].items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise RepositoryError(f"{path}: unreadable provenance ({exc})") from exc
