#!/usr/bin/env bash
# Installs what Larder needs to build, test and run locally, and only what is missing.
#
#   Debian packages: postgresql-15, postgresql-server-dev-15, redis-server, php-cli, php-pgsql, phpunit
#   Go tools (pinned; the module proxy refuses @latest for some modules): staticcheck, nats-server, k6
#
# Idempotent: a second run installs nothing and does not touch the network.
# Run as root (CI does) or with sudo available. Set LARDER_NO_INSTALL=1 to only check.
set -euo pipefail

STATICCHECK_VERSION=v0.6.1
NATS_SERVER_VERSION=v2.15.2
K6_VERSION=v1.8.1

DEBIAN_PACKAGES=(postgresql-15 postgresql-server-dev-15 redis-server php-cli php-pgsql phpunit)

log() { printf 'deps: %s\n' "$*" >&2; }

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  if [[ "${LARDER_NO_INSTALL:-}" == 1 ]]; then
    log "missing Debian packages: ${missing[*]} (run: apt-get install ${missing[*]})"
    exit 1
  fi
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { log "need root or sudo to install: ${missing[*]}"; exit 1; }
    SUDO=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  # apt-get update only when the package lists cannot offer what is missing.
  if ! apt-cache show "${missing[@]}" >/dev/null 2>&1; then
    log "apt-get update"
    "${SUDO[@]}" apt-get update -qq
  fi
  log "apt-get install ${missing[*]}"
  # Never start the distribution's own PostgreSQL/Redis services: tests and the local stack start their own.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
    "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
    trap '"${SUDO[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

GOBIN_DIR=$(go env GOBIN)
[[ -n "$GOBIN_DIR" ]] || GOBIN_DIR="$(go env GOPATH)/bin"

# go_tool NAME VERSION PACKAGE VERSION-CHECK-REGEX
go_tool() {
  local name=$1 version=$2 pkg=$3
  local bin="$GOBIN_DIR/$name"
  if [[ -x "$bin" ]] && go version -m "$bin" 2>/dev/null | grep -q "[[:space:]]mod[[:space:]].*[[:space:]]${version}[[:space:]]"; then
    return 0
  fi
  if [[ "${LARDER_NO_INSTALL:-}" == 1 ]]; then
    log "missing Go tool $name $version (run: go install $pkg@$version)"
    exit 1
  fi
  log "go install $pkg@$version"
  GOFLAGS= go install "$pkg@$version"
}

go_tool staticcheck "$STATICCHECK_VERSION" honnef.co/go/tools/cmd/staticcheck
go_tool nats-server "$NATS_SERVER_VERSION" github.com/nats-io/nats-server/v2
go_tool k6 "$K6_VERSION" go.k6.io/k6

log "all dependencies present"
