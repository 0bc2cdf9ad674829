#!/usr/bin/env bash
# prepare-wmt14-en-de.sh: `fairseq-ext prepare wmt14-en-de` (the recipe fairseq_ext/recipes/prepare-wmt14-en-de.sh), from this checkout (scripts/lib/checkout.sh). Options: --help.
# shellcheck source=lib/checkout.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/checkout.sh"
fsx_exec_recipe prepare-wmt14-en-de.sh "$@"
