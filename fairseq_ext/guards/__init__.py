"""The plugin's guards on fairseq 0.12 (docs/trust.md), installed by :func:`install` when
``fairseq_ext`` is imported with fairseq, or when fairseq's import ends (fairseq_ext/__init__.py).
Each replaces attributes that fairseq looks up at call time with wrappers around fairseq's own
(:func:`fairseq_ext.guards.patching.replace`; idempotent), in :data:`ORDER`: checkpoint_safety
first, so that nothing the other guards load escapes it; one_line_errors before training_checks,
whose errors it prints. No guard module imports fairseq before its ``install`` runs (each imports
what it patches there), so that any of them imported first never starts fairseq's import, and with
it the registration, while it is itself half imported.
"""
import importlib

ORDER = ("checkpoint_safety", "batching", "resume", "one_line_errors", "training_checks", "training_summary", "bf16")


def install() -> None:
    """Install every guard, in :data:`ORDER`; idempotent."""
    for name in ORDER:
        importlib.import_module(f"{__name__}.{name}").install()
