#!/usr/bin/env bash
# evaluate.sh: `fairseq-ext evaluate` (fairseq_ext/tools/evaluate.py), from this checkout (scripts/lib/checkout.sh). Options: --help.
# shellcheck source=lib/checkout.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/checkout.sh"
fsx_exec_command evaluate "$@"
