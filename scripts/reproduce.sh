#!/usr/bin/env bash
# Reproduce a results table of the papers (README: "Reproducing the papers' tables").
#   scripts/reproduce.sh --list | TABLE [--dry-run] [--rows ...] [--smoke] [--budget N|Nm] [--nproc N] ...
# A thin wrapper of `python -m fairseq_ext.reproduce` with this checkout's venv, if any.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY=python3
if [[ -x "$HERE/../.venv/bin/python" ]]; then PY="$HERE/../.venv/bin/python"; export PATH="$HERE/../.venv/bin:$PATH"
elif command -v fairseq-train >/dev/null 2>&1; then PY="$(dirname "$(command -v fairseq-train)")/python"; fi
exec "$PY" -m fairseq_ext.reproduce "$@"
