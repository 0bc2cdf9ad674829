"""Every sentence reaches a batch: the fix of fairseq 0.12's ``batch_by_size``.

fairseq 0.12's ``data_utils.batch_by_size`` ends with::

    if bsz_mult > 1 and len(b[-1]) % bsz_mult != 0:
        b = b[:-1]

so the last batch is thrown away when its size is not a multiple of
``--required-batch-size-multiple`` (default 8; upstream issue 5036). fairseq-generate then
translates 456 of Multi30k's 461 test_2017_mscoco sentences, validation leaves out the
longest sentences, and nothing says so. (The last batch is the only one allowed to be
smaller: every other batch is already a multiple or hits ``--max-tokens``.)

Why a patch, and this one: the drop happens inside the one function every fairseq dataset
batches through (generation, interactive, validation, training), after any flag could
help, so defaults or flags cannot avoid it (``--required-batch-size-multiple 1`` would,
but changes every batch and has to be remembered on every command). :func:`install` (run by
:func:`fairseq_ext.guards.install` when the plugin is imported) wraps the function: it calls fairseq's own implementation and,
if the returned batches cover fewer indices than it was given, appends the missing tail as
the final batch. The batches are built in index order, so the missing indices are exactly
the dropped last batch, which already respects ``--max-tokens``/``--batch-size``; every
other batch is unchanged. ``fixed_shapes`` batching (no drop there) is passed through.
"""
import numpy as np
from fairseq.data import data_utils

from fairseq_ext.guards.patching import replace


def _keep_final_batch(batch_by_size):
    def batch_by_size_keeping_final_batch(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None,
                                          max_sentences=None, required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec=num_tokens_vec, max_tokens=max_tokens,
                                max_sentences=max_sentences,
                                required_batch_size_multiple=required_batch_size_multiple,
                                fixed_shapes=fixed_shapes)
        if fixed_shapes is not None:
            return batches
        covered = sum(len(batch) for batch in batches)
        if covered < len(indices):
            batches = list(batches) + [np.asarray(indices[covered:], dtype=np.int64)]
        return batches

    return batch_by_size_keeping_final_batch


def install() -> None:
    replace(data_utils, "batch_by_size", _keep_final_batch)
