"""Regenerate the internal gRPC stubs from protos/ into services/tiermesh/v1/.

Run with `make protos`. tests/unit/test_protos_drift.py fails when the committed stubs
differ from what this script produces.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "services"


def generate(out_dir: Path) -> list[Path]:
    """Generate stubs under out_dir (tiermesh/v1/...) and return the files written."""
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    sources = sorted(
        str(p.relative_to(PROTOS)) for p in (PROTOS / "tiermesh" / "v1").glob("*.proto")
    )
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    pkg = out_dir / "tiermesh" / "v1"
    init = pkg / "__init__.py"
    init.write_text('"""Generated internal gRPC stubs (scripts/gen_protos.py). Do not edit."""\n')
    return sorted(pkg.iterdir())


def main() -> None:
    if "--check" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = generate(Path(tmp))
            committed = OUT / "tiermesh" / "v1"
            stale = [
                f.name
                for f in fresh
                if not (committed / f.name).exists()
                or (committed / f.name).read_bytes() != f.read_bytes()
            ]
            # A stub whose .proto is gone is drift too.
            names = {f.name for f in fresh}
            stale += [f.name for f in committed.iterdir() if f.is_file() and f.name not in names]
        if stale:
            raise SystemExit(f"generated stubs drifted: {stale}; run `make protos`")
        print("stubs up to date")
        return
    for f in generate(OUT):
        print(f"wrote {f.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
