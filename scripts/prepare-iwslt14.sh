#!/usr/bin/env bash
# prepare-iwslt14.sh: `fairseq-ext prepare iwslt14` (the recipe fairseq_ext/recipes/prepare-iwslt14.sh), from this checkout (scripts/lib/checkout.sh). Options: --help.
# shellcheck source=lib/checkout.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/checkout.sh"
fsx_exec_recipe prepare-iwslt14.sh "$@"
