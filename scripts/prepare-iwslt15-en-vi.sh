#!/usr/bin/env bash
# prepare-iwslt15-en-vi.sh: runs the package's recipe fairseq_ext/recipes/prepare-iwslt15-en-vi.sh (what `fairseq-ext prepare iwslt15-en-vi`
# runs), with this checkout's .venv when it has one. Options: --help.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py=python3
if [[ -n "${PYTHON:-}" ]]; then py="$PYTHON"
elif [[ -x "$here/../.venv/bin/python" ]]; then py="$here/../.venv/bin/python"
elif command -v fairseq-train >/dev/null 2>&1; then py="$(dirname "$(command -v fairseq-train)")/python"; fi
# as `fairseq-ext prepare iwslt15-en-vi`: the recipe's helpers run with this Python, and its environment's
# commands (fairseq-train, subword-nmt, ...) come first on PATH
export PYTHON="$py"
PATH="$(dirname "$py"):$PATH"
export PATH
exec bash "$here/../fairseq_ext/recipes/prepare-iwslt15-en-vi.sh" "$@"
