# shellcheck shell=bash
# Sourced by the thin callers in scripts/: run a command of this checkout's package with its
# Python ($PYTHON, else the checkout's .venv, else the one beside fairseq-train on PATH),
# that environment's commands (fairseq-train, fairseq-generate, subword-nmt, ...) first on
# PATH and this checkout's fairseq_ext the one imported.
FSX_CHECKOUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
    FSX_CHECKOUT_PY="$PYTHON"
elif [[ -x "$FSX_CHECKOUT/.venv/bin/python" ]]; then
    FSX_CHECKOUT_PY="$FSX_CHECKOUT/.venv/bin/python"
elif command -v fairseq-train >/dev/null 2>&1; then
    FSX_CHECKOUT_PY="$(dirname "$(command -v fairseq-train)")/python"
else
    FSX_CHECKOUT_PY=python3
fi
PATH="$(dirname "$FSX_CHECKOUT_PY"):$PATH"
export PATH
export PYTHONPATH="$FSX_CHECKOUT${PYTHONPATH:+:$PYTHONPATH}"

# fsx_exec_recipe NAME ARGS...: the package's bash recipe fairseq_ext/recipes/NAME, as
# `fairseq-ext prepare|train` runs it (without loading the package first)
fsx_exec_recipe() {
    local name="$1"
    shift
    export PYTHON="$FSX_CHECKOUT_PY"
    FSX_COMMAND="scripts/$name" exec bash "$FSX_CHECKOUT/fairseq_ext/recipes/$name" "$@"
}

# fsx_exec_command COMMAND ARGS...: `fairseq-ext COMMAND ARGS...`
fsx_exec_command() {
    exec "$FSX_CHECKOUT_PY" -m fairseq_ext "$@"
}
