"""The plugin's guards on fairseq 0.12, installed by :func:`install` when ``fairseq_ext`` is
imported (``--user-dir fairseq_ext``; see docs/trust.md).

Each guard replaces an attribute that fairseq looks up at call time with a wrapper around
fairseq's own (:func:`fairseq_ext.guards.patching.replace`); a second :func:`install` changes
nothing. In installation order:

1. :mod:`~fairseq_ext.guards.checkpoint_safety`: torch ``weights_only=True`` allowlist for
   the types fairseq checkpoints hold, and a strict literal grammar for every config field
   fairseq would ``eval()``, checked on every checkpoint load. First, so that nothing the
   other guards load escapes it.
2. :mod:`~fairseq_ext.guards.batching`: no sentence dropped by ``batch_by_size`` (fairseq 0.12
   drops the final batch when its size is not a multiple of 8).
3. :mod:`~fairseq_ext.guards.resume`: multi-process resume and crash-safe checkpoint
   resumption (its ``load_checkpoint`` wrapper loads through the checked
   ``load_checkpoint_to_cpu``).
4. :mod:`~fairseq_ext.guards.one_line_errors`: errors of the plugin print as one line, not
   a traceback.
5. :mod:`~fairseq_ext.guards.training_checks`: checks of the model against the criterion
   when training starts (their errors print through 4).
6. :mod:`~fairseq_ext.guards.training_summary`: one closing line when ``fairseq-train``
   stops, saying how many of the planned updates ran and, when the time cap cut the run,
   how to continue it (only inside ``fairseq-train``).
7. :mod:`~fairseq_ext.guards.bf16`: ``--bf16`` trains on the GPU or CPU it runs on, instead
   of implying ``--tpu`` where no XLA can run.
"""
from fairseq_ext.guards import (batching, bf16, checkpoint_safety, one_line_errors, resume, training_checks,
                                training_summary)

ORDER = (checkpoint_safety, batching, resume, one_line_errors, training_checks, training_summary, bf16)


def install() -> None:
    """Install every guard, in :data:`ORDER`; idempotent."""
    for guard in ORDER:
        guard.install()
