#!/usr/bin/env bash
# Make sure `redis-server` (Redis 7+) is on PATH: install Debian's package when we can,
# otherwise stop with one line saying what to do. Used by `make run` and `make test`, which
# stop when it fails (every integration and e2e test needs a real redis-server).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/apt_install.sh
. "$here/apt_install.sh"
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server not found; installing Debian's redis-server package..." >&2
if apt_install redis-server; then
  command -v redis-server >/dev/null 2>&1 && exit 0
  APT_WHY="the redis-server package put no redis-server on PATH"
fi
echo "error: no redis-server ($APT_WHY): install Redis 7+ (apt-get install redis-server, brew install redis) and run make again." >&2
exit 1
