#!/usr/bin/env bash
# Make sure `promtool` (Prometheus' rule checker, 2.x or 3.x) is on PATH for the alert-rule
# tests (`promtool check rules`, `promtool test rules`). Used by `make test`.
# Order: a promtool already on PATH; else Debian's `prometheus` package, which ships it
# (about 60 MB with its web assets, installed without recommends); else say what to do.
# No PyPI or npm package ships the upstream promtool binary (none in their indexes), so apt
# is the route here.
set -euo pipefail
if command -v promtool >/dev/null 2>&1 && promtool --version >/dev/null 2>&1; then
  exit 0
fi
echo "promtool not found; installing Debian's prometheus package (it ships promtool)..." >&2
if command -v apt-get >/dev/null 2>&1 && apt-cache policy prometheus 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "error: need root (or sudo) to run apt-get install prometheus." >&2
      echo "Install promtool yourself; without it the alert-rule tests skip with that reason." >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The package may start a system-wide Prometheus; the tests only need the promtool binary.
  if command -v service >/dev/null 2>&1; then $SUDO service prometheus stop >/dev/null 2>&1 || true; fi
  command -v promtool >/dev/null 2>&1 && exit 0
fi
echo "error: could not install promtool here." >&2
echo "Install it (Debian/Ubuntu: apt-get install prometheus; macOS: brew install prometheus;" >&2
echo "or the release tarball from https://prometheus.io/download/ with promtool on PATH);" >&2
echo "without it the alert-rule tests skip with that reason." >&2
exit 1
