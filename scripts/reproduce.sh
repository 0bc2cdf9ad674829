#!/usr/bin/env bash
# reproduce.sh: `fairseq-ext reproduce` (fairseq_ext/reproduce), from this checkout (scripts/lib/checkout.sh). Options: --help.
# shellcheck source=lib/checkout.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/checkout.sh"
fsx_exec_command reproduce "$@"
