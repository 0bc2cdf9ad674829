#!/usr/bin/env bash
# train.sh: `fairseq-ext train` (the launcher fairseq_ext/recipes/train.sh), from this checkout (scripts/lib/checkout.sh). Options: --help.
# shellcheck source=lib/checkout.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/checkout.sh"
fsx_exec_recipe train.sh "$@"
