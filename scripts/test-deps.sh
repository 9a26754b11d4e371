#!/usr/bin/env bash
# Programs the tests need from outside Python, from Debian's packages: redis-server (shared
# limits and state), prometheus and promtool (the dashboard's and alert rules' queries against a
# real Prometheus), chromium (the dashboard in a headless browser), kubectl (its kustomize
# renders deploy/kubernetes/). `make test` runs this before pytest, so `.ci/run` has them on a
# new machine. Idempotent: what is on PATH is not installed again, and with everything present
# it does nothing (no root needed).
set -euo pipefail

# program:package, one pair a word.
needed="redis-server:redis-server prometheus:prometheus promtool:prometheus chromium:chromium
kubectl:kubernetes-client"

found() {
    command -v "$1" >/dev/null 2>&1 || [ -x "/usr/bin/$1" ] || [ -x "/usr/sbin/$1" ]
}

missing=()
for pair in $needed; do
    program=${pair%%:*}
    package=${pair#*:}
    if ! found "$program" && [[ " ${missing[*]-} " != *" $package "* ]]; then
        missing+=("$package")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo=(sudo -n)
    else
        echo "test-deps: missing ${missing[*]}; as root: apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "test-deps: missing ${missing[*]} and there is no apt-get to install them" >&2
    exit 1
fi

echo "test-deps: installing ${missing[*]} from Debian's packages"
export DEBIAN_FRONTEND=noninteractive
install=("${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}")
# A new machine may have no package lists yet: update once, only when the install needs it.
if ! "${install[@]}" >/dev/null 2>&1; then
    "${sudo[@]}" apt-get update -qq
    "${install[@]}" >/dev/null
fi

for pair in $needed; do
    program=${pair%%:*}
    if ! found "$program"; then
        echo "test-deps: installed ${missing[*]}, but $program is still not found" >&2
        exit 1
    fi
done
