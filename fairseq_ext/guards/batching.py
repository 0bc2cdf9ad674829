"""Every sentence reaches a batch (docs/trust.md, "No sentence is dropped").

fairseq 0.12's ``data_utils.batch_by_size`` drops the last batch when its size is not a multiple
of ``--required-batch-size-multiple`` (upstream issue 5036). The wrapper appends the missing tail
(batches are built in index order) as the final batch; ``fixed_shapes`` batching is passed through.
"""
import numpy as np

from fairseq_ext.guards.patching import replace


def _keep_final_batch(batch_by_size):
    def batch_by_size_keeping_final_batch(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None,
                                          max_sentences=None, required_batch_size_multiple=1, fixed_shapes=None):
        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        batches = batch_by_size(indices, num_tokens_fn, num_tokens_vec=num_tokens_vec, max_tokens=max_tokens,
                                max_sentences=max_sentences, required_batch_size_multiple=required_batch_size_multiple,
                                fixed_shapes=fixed_shapes)
        if fixed_shapes is not None:
            return batches
        covered = sum(len(batch) for batch in batches)
        if covered < len(indices):
            batches = list(batches) + [np.asarray(indices[covered:], dtype=np.int64)]
        return batches

    return batch_by_size_keeping_final_batch


def install() -> None:
    from fairseq.data import data_utils

    replace(data_utils, "batch_by_size", _keep_final_batch)
