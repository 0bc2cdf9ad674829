#!/usr/bin/env bash
# train.sh: a thin caller of `fairseq-ext train` (the recipe ships inside the package,
# fairseq_ext/recipes/), with this checkout's .venv when it has one. Options: --help.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py=python3
if [[ -n "${PYTHON:-}" ]]; then py="$PYTHON"
elif [[ -x "$here/../.venv/bin/python" ]]; then py="$here/../.venv/bin/python"
elif command -v fairseq-train >/dev/null 2>&1; then py="$(dirname "$(command -v fairseq-train)")/python"; fi
exec "$py" -m fairseq_ext train "$@"
