"""provenance.yaml decides whether a fetched folder is rebuilt: by the converter's version
and by a digest of its source, so that converter code changed without a version bump still
rebuilds (and a test may take an up-to-date folder as this code's output)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from tiermesh.convert import provenance
from tiermesh.convert.provenance import Source

SOURCES = (Source("some-wheel", "1.0"),)


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "m" / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"weights")
    provenance.write(folder, "m", SOURCES, ["built"], ["model.onnx"])
    return folder


def _edit_tools(folder: Path, edit: Callable[[dict[str, str]], object]) -> None:
    """Rewrite the record's `tools` through `edit`."""
    path = folder / provenance.FILE_NAME
    record = yaml.safe_load(path.read_text())
    edit(record["tools"])
    path.write_text(yaml.safe_dump(record))


def test_a_folder_written_by_this_converter_is_up_to_date(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    tools = provenance.read(folder)["tools"]  # type: ignore[index]
    assert tools["tiermesh_converter_sources"] == provenance.converter_digest()
    assert provenance.up_to_date(folder, SOURCES, ["model.onnx"])


def test_other_converter_source_means_rebuild(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _edit_tools(folder, lambda tools: tools.update(tiermesh_converter_sources="0" * 64))
    assert not provenance.up_to_date(folder, SOURCES, ["model.onnx"])


def test_a_record_without_the_source_digest_means_rebuild(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    _edit_tools(folder, lambda tools: tools.pop("tiermesh_converter_sources"))
    assert not provenance.up_to_date(folder, SOURCES, ["model.onnx"])


def test_the_digest_changes_with_any_module_below_the_root(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    first = provenance.source_digest(tmp_path)
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    second = provenance.source_digest(tmp_path)
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")
    third = provenance.source_digest(tmp_path)
    (tmp_path / "notes.txt").write_text("not code")
    assert len({first, second, third}) == 3
    assert provenance.source_digest(tmp_path) == third
    package = Path(provenance.__file__).resolve().parent
    assert provenance.converter_digest() == provenance.source_digest(package)
