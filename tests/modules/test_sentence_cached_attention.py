"""SentenceCachedAttention decodes as fairseq's own MultiheadAttention does, step by step through
beam search's reorders (a shuffle within each sentence's beam, then a batch that shrinks), as a
self-attention and as a cross-attention over a beam-expanded source, while it caches the
source's keys and values once per sentence, joins each reorder to the next step and, between
reorders, writes each step's keys and values into room left after the cached ones."""
import copy

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_ext.modules.stacked_source_attention import SentenceCachedAttention

D, HEADS, BEAM, SENTENCES, J = 16, 4, 3, 2, 5


@pytest.mark.parametrize("cross", [False, True])
def test_steps_equal_fairseqs_through_reorders(cross):
    torch.manual_seed(0)
    stock = MultiheadAttention(D, HEADS, self_attention=not cross, encoder_decoder_attention=cross).double().eval()
    ours = copy.deepcopy(stock)
    ours.__class__ = SentenceCachedAttention
    n = SENTENCES * BEAM
    source = torch.randn(J, SENTENCES, D, dtype=torch.double).repeat_interleave(BEAM, dim=1)  # J x n x C
    source_pad = torch.zeros(SENTENCES, J, dtype=torch.bool)
    source_pad[1, :2] = True  # the second sentence is left-padded
    source_pad = source_pad.repeat_interleave(BEAM, dim=0)
    shuffle = torch.tensor([2, 0, 1, 4, 5, 3])  # within each sentence's beam
    shrink = torch.tensor([3, 4, 5])  # the first sentence finished
    states, rows, starts = ({}, {}), torch.arange(n), []
    with torch.no_grad():
        for step in range(7):
            if step == 4:
                for module, state in zip((stock, ours), states):
                    module.reorder_incremental_state(state, shuffle)
                rows = rows[shuffle]
            if step == 5:
                for module, state in zip((stock, ours), states):
                    module.reorder_incremental_state(state, shrink)
                rows = rows[shrink]
            x = torch.randn(1, len(rows), D, dtype=torch.double)
            outs = []
            for module, state in zip((stock, ours), states):
                key = source[:, rows] if cross else x
                pad = source_pad[rows] if cross else None
                outs.append(module(x, key, key, key_padding_mask=pad, incremental_state=state, static_kv=cross,
                                   need_weights=True))
            (out, weights), (our_out, our_weights) = outs
            torch.testing.assert_close(our_out, out, atol=1e-12, rtol=1e-10)
            torch.testing.assert_close(our_weights, weights.type_as(our_weights), atol=1e-6, rtol=1e-6)
            if not cross:
                starts.append(ours._get_input_buffer(states[1])["prev_key"].data_ptr())
    if cross:  # one row of keys per sentence left, not per hypothesis
        cached = ours.get_incremental_state(states[1], "attn_state")
        assert cached["static_k"].size(0) == 1 and cached["static_rows"].tolist() == [0, 0, 0]
    else:  # steps 1 (room for 4 steps), 2 and 3 in one tensor; steps 4 and 5 copy, reordered; 6 makes room
        assert starts[1] == starts[2] == starts[3] and all(a != b for a, b in zip(starts[3:], starts[4:]))
