"""Incremental decoding and beam search of every joint-attention strategy: one token at a
time equals teacher forcing across a beam reorder, every cached tensor follows a reorder that
drops and permutes sentences, the static keys and values of the source memory are projected
once per sentence (one cached row per sentence where the beam's rows are copies), fairseq's
beam search returns the teacher-forced scores, and models with a masked source layer decode
incrementally."""
import pytest
import torch

from fairseq_ext.modules.stacked_source_attention import StackedSourceAttention
from joint_attention_reference import (
    ALL_OPTIONS,
    L_SMALL,
    MLMHA,
    SHARES_STATIC_ROWS,
    STRATEGIES,
    small_model,
)
from model_utils import beam_search_rescored, full_and_incremental, random_batch


@pytest.mark.parametrize("strategy,n", [(s, L_SMALL) for s in ALL_OPTIONS] + [(s, 2) for s in STRATEGIES if s != "transparent"])
def test_incremental_decoding_equals_teacher_forcing(strategy, n):
    model, _, dictionary = small_model(strategy, n=None if strategy == "none" else n)
    src, lengths, prev = random_batch(dictionary, beam=2)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    torch.testing.assert_close(incremental, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy", ALL_OPTIONS)
def test_cached_state_follows_a_reorder_that_drops_and_permutes_sentences(strategy):
    """As beam search does when sentences finish: the batch shrinks and the rows move;
    every cached tensor (static keys/values of every collected layer included) follows."""
    model, _, dictionary = small_model(strategy)
    src, lengths, prev = random_batch(dictionary, bsz=3, beam=2)  # rows: sentence 0, 0, 1, 1, 2, 2
    new_order = torch.tensor([5, 4, 0, 1])  # sentence 1 finished; 2 before 0
    with torch.no_grad():
        full = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        encoder_out = model.encoder(src, src_lengths=lengths)
        state, rows = {}, torch.arange(src.size(0))
        for t in range(prev.size(1)):
            if t == 2:
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
                model.decoder.reorder_incremental_state_scripting(state, new_order)
                rows = rows[new_order]
            out = model.decoder(prev[rows, : t + 1], encoder_out=encoder_out, incremental_state=state)
            step = model.get_normalized_probs(out, log_probs=True)[:, -1]
            torch.testing.assert_close(step, full[rows, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("strategy", SHARES_STATIC_ROWS)
def test_a_sentences_beam_shares_one_row_of_static_keys_and_values(strategy):
    """The attentions over n stacked sources project and cache the static keys/values once
    per sentence in decoding (its beam's encoder rows are copies). A reorder that drops
    sentences keeps one row per sentence; any other reorder falls back to one row per
    hypothesis. The outputs are the teacher-forced ones throughout."""
    from fairseq_ext.modules.attention_utils import identical_row_groups

    model, _, dictionary = small_model(strategy)
    attentions = [m for m in model.decoder.modules() if isinstance(m, StackedSourceAttention)]
    src, lengths, prev = random_batch(dictionary, bsz=3, beam=3)  # rows: sentence 0, 0, 0, 1, 1, 1, 2, 2, 2
    orders = {2: torch.tensor([8, 6, 7, 1, 0, 2]),  # sentence 1 finished, 2 before 0: still blocks of 3
              3: torch.tensor([0, 4, 5])}  # a block of 3 from different sentences
    cached_rows = {0: 3, 2: 2, 3: 3}
    with torch.no_grad():
        full = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        encoder_out = model.encoder(src, src_lengths=lengths)
        assert identical_row_groups(encoder_out["encoder_out"][0]) == 3
        state, rows = {}, torch.arange(src.size(0))
        for t in range(prev.size(1)):
            if t in orders:
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, orders[t])
                model.decoder.reorder_incremental_state_scripting(state, orders[t])
                rows = rows[orders[t]]
            out = model.decoder(prev[rows, : t + 1], encoder_out=encoder_out, incremental_state=state)
            step = model.get_normalized_probs(out, log_probs=True)[:, -1]
            torch.testing.assert_close(step, full[rows, t], atol=1e-5, rtol=0)
            if t in cached_rows:
                for attention in attentions:
                    buffer = attention._get_input_buffer(state)
                    assert buffer["static_k"].size(0) == cached_rows[t] and buffer["static_rows"].numel() == rows.numel()


def record_static_projections(model, step):
    """{module: [decoding steps]} of every projection of the source memory into keys (not the
    self-attention's): fairseq's k_proj of the stock cross-attentions, and the batched key
    and value projection of all n sources of the stacked-source attentions (MLMHA, flat),
    called once for the keys and once for the values."""
    from fairseq.modules import MultiheadAttention

    from fairseq_ext.modules.stacked_source_attention import StackedSourceAttention

    calls = {}
    for index, layer in enumerate(model.decoder.layers):
        for owner in (layer.encoder_attn, layer.serial_stack):
            if owner is None:
                continue
            for name, module in owner.named_modules():
                if name.startswith("context_attention"):
                    continue  # hierarchical's second level: its keys are each step's contexts
                key = f"{index}.{type(owner).__name__}{'.' + name if name else ''}"
                if isinstance(module, StackedSourceAttention):
                    calls[key] = []

                    def project(memory, projections, key=key, original=module._project_sources):
                        calls[key].append(step[0])
                        return original(memory, projections)

                    module._project_sources = project
                elif isinstance(module, MultiheadAttention):
                    calls[key] = []
                    module.k_proj.register_forward_hook(lambda m, i, o, key=key: calls[key].append(step[0]))
    return calls


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_static_keys_and_values_are_projected_once_per_sentence(strategy):
    model, args, dictionary = small_model(strategy)
    step = [0]
    calls = record_static_projections(model, step)
    assert calls
    src, lengths, prev = random_batch(dictionary, beam=2)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        state = {}
        for t in range(prev.size(1)):
            step[0] = t
            if t == 2:  # a beam reorder must not recompute them either
                order = torch.arange(src.size(0)).view(-1, 2).flip(1).reshape(-1)
                encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
                model.decoder.reorder_incremental_state_scripting(state, order)
            model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
    for name, steps in calls.items():
        assert steps and set(steps) == {0}, (name, steps)
    if strategy in MLMHA:  # W^{k,i} and W^{v,i} of every layer: once per sentence, on the first step
        assert calls == {f"{j}.MultiLayerMultiheadAttention": [0, 0] for j in range(len(model.decoder.layers))}


@pytest.mark.parametrize("strategy", ALL_OPTIONS)
def test_sequence_generator_beam_search(strategy):
    """fairseq's beam search (beam 3) returns hypotheses whose positional scores are the
    teacher-forced scores of the same tokens on each sentence alone (so reordering and batch
    shrinking kept every cache aligned)."""
    model, _, dictionary = small_model(strategy)
    src, lengths, _ = random_batch(dictionary, bsz=4, src_len=7, seed=3)
    beam_search_rescored(model.float(), dictionary, src, lengths, max_len_b=10)


@pytest.mark.parametrize("mode", ["zero", "remove"])
@pytest.mark.parametrize("strategy,mask", [("serial", L_SMALL), ("serial", 1), ("m-00", 2), ("m-11", 1),
                                           ("parallel", 2), ("flat", 3), ("hierarchical", 2)])
def test_masked_models_decode_incrementally(strategy, mask, mode):
    model, _, dictionary = small_model(strategy, "--mask-source-layer", str(mask), "--mask-source-mode", mode)
    if strategy == "serial" and mask == L_SMALL:
        assert all(layer.encoder_attn.removed == (mode == "remove") for layer in model.decoder.layers)
    src, lengths, prev = random_batch(dictionary, beam=2)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    torch.testing.assert_close(full, incremental, atol=1e-5, rtol=0)
