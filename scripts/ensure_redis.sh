#!/usr/bin/env bash
# Make sure `redis-server` (Redis 7+) is on PATH: install Debian's package when we can,
# otherwise say exactly what to do. Used by `make run` and `make test`.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server not found; installing Debian's redis-server package..." >&2
if command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "error: need root (or sudo) to run apt-get install redis-server." >&2
      echo "Install it yourself, or set TIERMESH_REDIS_URL to a running Redis 7+." >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  # The package may start a system-wide server; the mesh and the tests run their own.
  if command -v service >/dev/null 2>&1; then $SUDO service redis-server stop >/dev/null 2>&1 || true; fi
  command -v redis-server >/dev/null 2>&1 && exit 0
fi
echo "error: could not install redis-server here." >&2
echo "Install Redis 7+ (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)," >&2
echo "or set TIERMESH_REDIS_URL to a running Redis 7+ for 'make run'." >&2
exit 1
