#!/usr/bin/env bash
# What the machine must have before `make setup` creates the venv (it runs this only then):
#   - the Python named by PYTHON is 3.11, with its venv module and ensurepip (Debian/Ubuntu
#     package them apart: python3.11-venv);
#   - memory available for `make test`'s two Spark drivers (4 GB heaps, most of it unused by the
#     small test data) and a broker: PREREQ_MIN_MEMORY_GB, default 6;
#   - free disk in the repo's filesystem for the venv and the jars (~2.8 GB) and the data:
#     PREREQ_MIN_DISK_GB, default 3.
# A shortfall is one line on stderr saying what to install or free, and exit 1; set a
# PREREQ_MIN_* variable to 0 to skip that check. Needs bash and coreutils only (no Python).
# Usage: infra/prerequisites.sh PYTHON
set -u
py="${1:-python3.11}"
repo="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
min_mem_gb="${PREREQ_MIN_MEMORY_GB:-6}"
min_disk_gb="${PREREQ_MIN_DISK_GB:-3}"
install="install Python 3.11 (Ubuntu: deadsnakes ppa python3.11 python3.11-venv) or run make PYTHON=/path/to/python3.11"

fail() {
  echo "error: $*" >&2
  exit 1
}

[[ "$min_mem_gb" =~ ^[0-9]+$ ]] || fail "PREREQ_MIN_MEMORY_GB=$min_mem_gb: a whole number of GB (0 skips the check)"
[[ "$min_disk_gb" =~ ^[0-9]+$ ]] || fail "PREREQ_MIN_DISK_GB=$min_disk_gb: a whole number of GB (0 skips the check)"

command -v "$py" >/dev/null 2>&1 || fail "$py not found: $install"
version="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"
[ "$version" = "3.11" ] || fail "$py is Python ${version:-of unknown version}, the project needs 3.11: $install"
if ! "$py" -m venv --help >/dev/null 2>&1 || ! "$py" -c 'import ensurepip' >/dev/null 2>&1; then
  fail "$py has no venv module or no ensurepip: install python3.11-venv (apt-get install python3.11-venv) or run make PYTHON=/path/to/python3.11"
fi

gb() { awk -v kb="$1" 'BEGIN { printf "%.1f", kb / 1048576 }'; }
mem_kb="$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo 2>/dev/null)"
if [ "$min_mem_gb" -gt 0 ] && [ -n "$mem_kb" ] && [ "$mem_kb" -lt $((min_mem_gb * 1048576)) ]; then
  fail "$(gb "$mem_kb") GB of memory available, the project needs ${min_mem_gb} GB (two 4 GB Spark drivers in make test and a Kafka broker): free memory, or set PREREQ_MIN_MEMORY_GB=0 to go on anyway (make test TEST_WORKERS=1 runs one driver)"
fi
disk_kb="$(df -Pk "$repo" 2>/dev/null | awk 'NR == 2 { print $4 }')"
if [ "$min_disk_gb" -gt 0 ] && [ -n "$disk_kb" ] && [ "$disk_kb" -lt $((min_disk_gb * 1048576)) ]; then
  fail "$(gb "$disk_kb") GB of disk free under $repo, the project needs ${min_disk_gb} GB (the venv and the jars take ~2.8 GB): free disk, or set PREREQ_MIN_DISK_GB=0 to go on anyway"
fi
echo "prerequisites: $py is Python 3.11 with venv; memory available: $(gb "${mem_kb:-0}") GB; disk free: $(gb "${disk_kb:-0}") GB"
