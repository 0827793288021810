#!/usr/bin/env bash
# The test suite. Extra arguments go to pytest, e.g.  scripts/test.sh -k verifier
source "$(dirname "$0")/env.sh"
exec python -m pytest -q "$@"
