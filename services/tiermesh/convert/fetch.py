"""Wheels from PyPI as a source of model files: download once into a cache, read members.

Called by the model fetchers; pip does the network work (`pip download`, so indexes, proxies
and certificates configured for pip apply), the cache makes repeated fetches offline.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tiermesh.convert.files import atomic_writer
from tiermesh.convert.progress import progress_enabled, stderr_fd

WHEELS_DIR = "wheels"
_STDERR_TAIL_LINES = 15


class FetchError(RuntimeError):
    """A wheel could not be downloaded or a member could not be read from it."""


def canonical_name(name: str) -> str:
    """PEP 503 normalisation: `Foo_Bar.baz` and `foo-bar-baz` name the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_matches(path: Path, package: str, version: str) -> bool:
    # PEP 427: {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl
    parts = path.name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        return False
    return canonical_name(parts[0]) == canonical_name(package) and parts[1] == version


def cached_wheel(package: str, version: str, cache_dir: Path) -> Path | None:
    """The cached wheel of package==version, or None when it has not been downloaded."""
    folder = cache_dir / WHEELS_DIR
    if not folder.is_dir():
        return None
    found = sorted(p for p in folder.glob("*.whl") if _wheel_matches(p, package, version))
    return found[0] if found else None


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-_STDERR_TAIL_LINES:]) or "(pip printed nothing)"


def fetch_wheel(package: str, version: str, cache_dir: Path, progress: bool = True) -> Path:
    """The path of the wheel of package==version under `<cache_dir>/wheels`.

    Downloads with `pip download --no-deps --only-binary=:all:` unless the wheel is already
    cached. The download lands in a private temporary folder and is moved into place, so an
    interrupted or concurrent fetch never leaves a partial wheel under the cached name.
    With `progress` (and stderr a terminal, or progress forced), pip's own output (its
    download bar) goes to stderr. Raises FetchError
    naming the package, the version and the tail of pip's stderr when pip fails.
    """
    found = cached_wheel(package, version, cache_dir)
    if found is not None:
        return found
    folder = cache_dir / WHEELS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    spec = f"{package}=={version}"
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--no-input",
            "-d",
            tmp,
            spec,
        ]
        # pip's stdout (its bar, "Saved ...") goes to our stderr so that it never mixes
        # with a command's own stdout; pip's stderr is kept for the error message.
        out = stderr_fd() if progress_enabled(progress) else None
        if out is None:
            cmd[4:4] = ["--quiet", "--progress-bar", "off"]
        try:
            done = subprocess.run(
                cmd,
                stdout=subprocess.DEVNULL if out is None else out,
                stderr=subprocess.PIPE,
                text=True,
                check=False,
            )
        except OSError as e:
            raise FetchError(f"cannot run pip to download {spec}: {e}") from e
        if done.returncode != 0:
            raise FetchError(
                f"pip could not download {spec} (exit {done.returncode}):\n{_tail(done.stderr)}"
            )
        wheels = [p for p in Path(tmp).glob("*.whl") if _wheel_matches(p, package, version)]
        if len(wheels) != 1:
            got = sorted(p.name for p in Path(tmp).iterdir())
            raise FetchError(f"pip download of {spec} gave {got}, expected one matching wheel")
        if not zipfile.is_zipfile(wheels[0]):
            raise FetchError(f"{wheels[0].name} from pip download of {spec} is not a zip file")
        target = folder / wheels[0].name
        os.replace(wheels[0], target)
    return target


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _record_hashes(archive: zipfile.ZipFile) -> dict[str, str]:
    """member -> `sha256=<urlsafe b64>` from the wheel's RECORD (empty when it has none)."""
    records = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        return {}
    hashes: dict[str, str] = {}
    for line in archive.read(records[0]).decode("utf-8").splitlines():
        # RECORD is CSV, but member names with commas are vanishingly rare in wheels and a
        # missed entry only skips the extra check.
        fields = line.rsplit(",", 2)
        if len(fields) == 3 and fields[1].startswith("sha256="):
            hashes[fields[0]] = fields[1]
    return hashes


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy one member of `wheel` to the file `dest` (its parents made) and return `dest`.

    Streams the member without unpacking the rest, checks it against the sha256 in the
    wheel's RECORD when listed there, and writes through a temporary file so `dest` is
    either the whole member or untouched. Raises FetchError when the member is missing or
    does not match RECORD.
    """
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise FetchError(f"cannot open wheel {wheel}: {e}") from e
    with archive:
        try:
            info = archive.getinfo(member)
        except KeyError:
            similar = [n for n in archive.namelist() if Path(n).name == Path(member).name]
            hint = f"; same file name at {similar}" if similar else ""
            raise FetchError(f"{wheel.name} has no member {member}{hint}") from None
        expected = _record_hashes(archive).get(member)
        digest = hashlib.sha256()
        with atomic_writer(dest) as out, archive.open(info) as src:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
            if expected is not None and expected != "sha256=" + _b64(digest.digest()):
                raise FetchError(f"{wheel.name}: {member} does not match the wheel's RECORD")
    return dest
