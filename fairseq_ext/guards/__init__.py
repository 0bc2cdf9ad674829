"""The plugin's guards on fairseq 0.12 (docs/trust.md), installed by :func:`install` when
``fairseq_ext`` is imported. Each replaces attributes that fairseq looks up at call time with
wrappers around fairseq's own (:func:`fairseq_ext.guards.patching.replace`; idempotent), in
:data:`ORDER`: checkpoint_safety first, so that nothing the other guards load escapes it;
one_line_errors before training_checks, whose errors it prints.
"""
from fairseq_ext.guards import (batching, bf16, checkpoint_safety, one_line_errors, resume, training_checks,
                                training_summary)

ORDER = (checkpoint_safety, batching, resume, one_line_errors, training_checks, training_summary, bf16)


def install() -> None:
    """Install every guard, in :data:`ORDER`; idempotent."""
    for guard in ORDER:
        guard.install()
