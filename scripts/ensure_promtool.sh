#!/usr/bin/env bash
# Make sure `promtool` (Prometheus' rule checker, 2.x or 3.x) is on PATH for the alert-rule
# tests (`promtool check rules`, `promtool test rules`). Used by `make test`, which stops
# when this fails: the rules are part of what the tests hold, so they never skip silently
# under make (a bare `pytest` without promtool skips them and says why).
# Order: a promtool already on PATH; else Debian's `prometheus` package, which ships it
# (about 60 MB with its web assets, installed without recommends). No PyPI or npm package
# ships the upstream promtool binary, so apt is the route here.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/apt_install.sh
. "$here/apt_install.sh"
if command -v promtool >/dev/null 2>&1 && promtool --version >/dev/null 2>&1; then
  exit 0
fi
echo "promtool not found; installing Debian's prometheus package (it ships promtool)..." >&2
if apt_install prometheus; then
  command -v promtool >/dev/null 2>&1 && exit 0
  APT_WHY="the prometheus package put no promtool on PATH"
fi
echo "error: no promtool ($APT_WHY): install it (apt-get install prometheus, brew install prometheus) and run make test again." >&2
exit 1
