#!/usr/bin/env bash
# prepare-iwslt-fr-ro.sh: `fairseq-ext prepare iwslt-fr-ro` (the recipe fairseq_ext/recipes/prepare-iwslt-fr-ro.sh), from this checkout (scripts/lib/checkout.sh). Options: --help.
# shellcheck source=lib/checkout.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/checkout.sh"
fsx_exec_recipe prepare-iwslt-fr-ro.sh "$@"
