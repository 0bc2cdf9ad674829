#!/usr/bin/env bash
# significance.sh: `fairseq-ext significance` (fairseq_ext/tools/compare.py), from this checkout (scripts/lib/checkout.sh). Options: --help.
# shellcheck source=lib/checkout.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/checkout.sh"
fsx_exec_command significance "$@"
