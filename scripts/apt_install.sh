#!/usr/bin/env bash
# Sourced by the ensure_*.sh scripts: install one Debian package with apt-get.
#   apt_install PACKAGE   -> 0 when installed; 1 when it cannot be, with the reason in
#                            APT_WHY (the caller prints it in its one error line).
# Under `set -euo pipefail` no early-exiting reader (grep -q, head) may close a pipe that a
# writer still fills: the writer dies of SIGPIPE and the pipeline fails although the answer
# was there. apt-cache's output is read whole (sed -n), never piped into grep -q.

apt_install() {
  local package="$1" sudo="" candidate
  APT_WHY=""
  if ! command -v apt-get >/dev/null 2>&1; then
    APT_WHY="no apt-get here to install $package"
    return 1
  fi
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      APT_WHY="installing $package needs root or sudo (apt-get install $package)"
      return 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  # A machine that never fetched its package lists knows no candidate: update first.
  if ! $sudo apt-get update -qq >/dev/null 2>&1; then
    APT_WHY="apt-get update failed, so $package cannot be installed here"
    return 1
  fi
  candidate=$(apt-cache policy "$package" 2>/dev/null | sed -n 's/^ *Candidate: *//p')
  if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
    APT_WHY="Debian's package lists here have no $package to install"
    return 1
  fi
  if ! $sudo apt-get install -y -qq --no-install-recommends "$package" >/dev/null; then
    APT_WHY="apt-get install $package failed (see apt's message above)"
    return 1
  fi
  # The package may start a system-wide server; the mesh and the tests run their own.
  if command -v service >/dev/null 2>&1; then
    $sudo service "$package" stop >/dev/null 2>&1 || true
  fi
  return 0
}
