#!/usr/bin/env bash
# prepare-multi30k.sh: `fairseq-ext prepare multi30k` (the recipe fairseq_ext/recipes/prepare-multi30k.sh), from this checkout (scripts/lib/checkout.sh). Options: --help.
# shellcheck source=lib/checkout.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/checkout.sh"
fsx_exec_recipe prepare-multi30k.sh "$@"
