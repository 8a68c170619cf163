#!/usr/bin/env bash
# Debian packages the make targets need, installed with apt-get when missing (`make system-deps`).
#
#   infra/system_packages.sh PACKAGE[=PROBE]...
#
# PROBE says whether the package's program is already there: a command on PATH (`mvn`) or a
# path glob for one installed off PATH (`/usr/lib/postgresql/*/bin/initdb`); without a probe,
# dpkg's record of PACKAGE. Missing packages are installed when running as root with apt-get;
# otherwise the script installs nothing, prints the exact command to run and exits 1.
set -euo pipefail

present() {  # present PACKAGE PROBE
  if [[ -z $2 ]]; then
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'
  elif [[ $2 == */* ]]; then
    compgen -G "$2" >/dev/null
  else
    command -v "$2" >/dev/null
  fi
}

missing() {
  local spec
  for spec in "${specs[@]}"; do
    if [[ $spec == *=* ]]; then present "${spec%%=*}" "${spec#*=}" || echo "${spec%%=*}"
    else present "$spec" "" || echo "$spec"
    fi
  done
}

specs=("$@")
mapfile -t todo < <(missing)
((${#todo[@]})) || exit 0

install=(apt-get install -y -q --no-install-recommends "${todo[@]}")
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
  echo "error: missing system packages: ${todo[*]}; install them with:" >&2
  echo "  sudo apt-get update && sudo ${install[*]}" >&2
  exit 1
fi
echo "installing system packages: ${todo[*]}"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet: update once, then try again.
"${install[@]}" || { apt-get update -q && "${install[@]}"; }
mapfile -t still < <(missing)
if ((${#still[@]})); then
  echo "error: installed, but still not found: ${still[*]}" >&2
  exit 1
fi
