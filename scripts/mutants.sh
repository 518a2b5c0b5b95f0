#!/usr/bin/env bash
# Mutation check of the guards that matter: each mutant removes one guard from a copy of the tree,
# which is rebuilt incrementally and run against the tests that must notice; it prints which
# survived. Not part of the test run (it takes about as long); run it before resolving an issue
# that adds or moves a guard (docs/reliability.md, "Tests that fail when a guard goes").
#   scripts/mutants.sh [WORD…]    only the mutants whose names contain a WORD
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -u scripts/mutants.py "$@"
