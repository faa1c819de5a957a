"""Builds the Go front door from go/*.go and the protos the Python side already has:
KServe's from tritonclient (model_config.proto, grpc_service.proto) and tiermesh's own
(tiermesh/v1), handed to protoc as a descriptor set, so no .proto file is kept twice.

Only Debian's packages: Go in GOPATH mode against /usr/share/gocode (no module download),
`protoc` with Debian's protoc-gen-go 1.3 (`plugins=grpc`). The binary is cached under
`<cache>/frontdoor/<digest>/` by a digest of the Go sources and the descriptors, so a mesh
starts it without building again; a changed source builds anew.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2  # type: ignore[import-untyped]
from google.protobuf.descriptor import FileDescriptor  # type: ignore[import-untyped]
from tritonclient.grpc import model_config_pb2, service_pb2

from tiermesh.v1 import books_pb2, delivery_pb2, job_pb2, router_pb2, tensor_pb2

SOURCES = Path(__file__).parent / "go"
TOOLS = ("go", "protoc", "protoc-gen-go")
PACKAGES = (
    "golang-go golang-google-grpc-dev golang-github-gomodule-redigo-dev golang-goprotobuf-dev "
    "protobuf-compiler"
)
DEBIAN_GOPATH = "/usr/share/gocode"
BINARY = "frontdoor"
# Go package of each group of descriptors (their import paths in go/*.go).
STUBS = {
    "inference": (model_config_pb2.DESCRIPTOR, service_pb2.DESCRIPTOR),
    "tiermeshv1": (
        tensor_pb2.DESCRIPTOR,
        job_pb2.DESCRIPTOR,
        router_pb2.DESCRIPTOR,
        delivery_pb2.DESCRIPTOR,
        books_pb2.DESCRIPTOR,
    ),
}


class FrontDoorUnavailable(RuntimeError):
    """The Go toolchain is missing or the build failed; the message says what to do."""


# Go packages the door imports beyond the standard library (Debian's sources, GOPATH mode).
GO_SOURCES = ("google.golang.org/grpc", "github.com/gomodule/redigo")


def missing_tools() -> list[str]:
    tools = [tool for tool in TOOLS if shutil.which(tool) is None]
    sources = [s for s in GO_SOURCES if not (Path(DEBIAN_GOPATH) / "src" / s).is_dir()]
    return tools + sources


def _descriptor_set(files: tuple[FileDescriptor, ...], go_package: str) -> bytes:
    out = descriptor_pb2.FileDescriptorSet()
    for file in files:
        proto = out.file.add()
        file.CopyToProto(proto)
        proto.options.go_package = go_package
        for message in proto.message_type:
            _plain_oneofs(message)
    return bytes(out.SerializeToString())


def _plain_oneofs(message: descriptor_pb2.DescriptorProto) -> None:
    """Debian's protoc-gen-go 1.3 predates proto3 `optional`: each such field becomes the
    one field of a real oneof (its synthetic one), the same on the wire and still with
    presence (RouteReply.retry_after_ms: unset means no advice)."""
    for field in message.field:
        if field.proto3_optional:
            field.proto3_optional = False
    for nested in message.nested_type:
        _plain_oneofs(nested)


def _digest(sets: dict[str, bytes], sources: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(sources.glob("*.go")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    for name, data in sorted(sets.items()):
        h.update(name.encode() + b"\0" + data)
    return h.hexdigest()[:16]


def build(cache_dir: Path, sources: Path = SOURCES) -> Path:
    """The front door's binary, built into `cache_dir/frontdoor/<digest>/` unless there.
    `sources`: another Go main package against the same stubs (benchmarks/grpc_hops.py's
    bare servicer)."""
    missing = missing_tools()
    if missing:
        raise FrontDoorUnavailable(
            f"the Go front door needs {', '.join(missing)}: apt-get install {PACKAGES}"
        )
    sets = {pkg: _descriptor_set(files, pkg) for pkg, files in STUBS.items()}
    out = cache_dir / "frontdoor" / _digest(sets, sources)
    binary = out / BINARY
    if binary.is_file():
        return binary
    work = out.with_name(out.name + f".building-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        _build_in(work, sets, cache_dir, sources)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)
    return binary


def _build_in(work: Path, sets: dict[str, bytes], cache_dir: Path, sources: Path) -> None:
    src = work / "src"
    (src / BINARY).mkdir(parents=True)
    for path in sources.glob("*.go"):
        shutil.copy(path, src / BINARY / path.name)
    for pkg, data in sets.items():
        (src / pkg).mkdir()
        desc = work / f"{pkg}.desc"
        desc.write_bytes(data)
        names = [f.name for f in STUBS[pkg]]
        _run(
            ["protoc", f"--descriptor_set_in={desc}", f"--go_out=plugins=grpc:{src / pkg}", *names],
            work,
        )
        _flatten(src / pkg)
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{work}:{DEBIAN_GOPATH}",
        "GOCACHE": str(cache_dir / "frontdoor" / "gocache"),
        "CGO_ENABLED": "0",
    }
    _run(["go", "build", "-o", str(work / BINARY), BINARY], work, env)


def _flatten(pkg_dir: Path) -> None:
    """protoc writes each stub under its proto's path (tiermesh/v1/job.pb.go); one Go
    package is one folder."""
    for stub in list(pkg_dir.rglob("*.pb.go")):
        if stub.parent != pkg_dir:
            stub.replace(pkg_dir / stub.name)


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise FrontDoorUnavailable(
            f"building the Go front door: {' '.join(argv[:2])} failed:\n{done.stderr.strip()}"
        )


def main() -> int:
    """`python -m tiermesh.frontdoor.build`: build (or find) the binary in the cache."""
    from tiermesh.core.cache_dir import default_cache_dir

    try:
        print(f"front door: {build(default_cache_dir())}")
    except FrontDoorUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
