#!/usr/bin/env bash
# The test suite on two workers (pytest-xdist; whole files per worker, TEST_WORKERS=0 runs it in
# one process). Extra arguments go to pytest, e.g.  scripts/test.sh -k verifier
source "$(dirname "$0")/env.sh"
# The Slurm tests start a one-node cluster on this host: Debian's slurm-wlm and munge, once.
if ! command -v slurmctld >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[setup] installing slurm-wlm and munge (apt-get) for the Slurm tests"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
fi
# The end-to-end tests keep real checkpoints of the built-in model: at most about 14 GiB at once
# (docs/benchmarks.md), removed as each test passes (pytest.ini). Too little room fails the suite
# late and everywhere with "No space left on device", so say so now.
tmp="$(python -c 'import tempfile; print(tempfile.gettempdir())')"
free_gib=$(( $(df -Pk "$tmp" | awk 'NR == 2 {print $4}') / 1048576 ))
if [ "$free_gib" -lt "${TEST_DISK_GIB:-16}" ]; then
  echo "error: $tmp has $free_gib GiB free and the suite needs ${TEST_DISK_GIB:-16} GiB there; free space (old pytest runs lie in $tmp/pytest-of-$(id -un)) or point TMPDIR at a larger disk" >&2
  exit 1
fi
# --no-loadscope-reorder: pytest-xdist would send the files with the most tests first; the
# collection order (tests/conftest.py: the two longest files first) is what balances the workers
# --durations=10: every run ends with its ten slowest tests and their times (docs/benchmarks.md)
exec python -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
    --durations=10 "$@"
