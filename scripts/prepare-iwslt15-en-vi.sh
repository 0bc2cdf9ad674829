#!/usr/bin/env bash
# prepare-iwslt15-en-vi.sh: `fairseq-ext prepare iwslt15-en-vi` (the recipe fairseq_ext/recipes/prepare-iwslt15-en-vi.sh), from this checkout (scripts/lib/checkout.sh). Options: --help.
# shellcheck source=lib/checkout.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/checkout.sh"
fsx_exec_recipe prepare-iwslt15-en-vi.sh "$@"
