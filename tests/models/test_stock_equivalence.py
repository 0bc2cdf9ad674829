"""The model with no option set is the stock Transformer (same parameters, state dict and
outputs; the presets have the stock counts), its encoder returns every layer while a beam
reorder carries only the layers decoding reads, fairseq's own SequenceGenerator runs beam
search on it, and (slow) stock fairseq-generate loads a checkpoint fairseq-train wrote with
the plugin."""
import subprocess

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from model_utils import (
    SMALL,
    USER_DIR,
    build,
    build_stock,
    clean_env,
    count_parameters,
    make_dictionary,
    random_batch,
)


@pytest.mark.parametrize("flags", [SMALL, SMALL + ("--share-all-embeddings",), SMALL + ("--encoder-normalize-before", "--decoder-normalize-before")])
def test_no_option_model_is_the_stock_transformer(flags):
    dictionary = make_dictionary()
    stock, _ = build_stock("transformer", *flags, dictionary=dictionary, seed=3)
    ours, _ = build("multilayer_transformer", *flags, dictionary=dictionary, seed=4)
    assert count_parameters(ours) == count_parameters(stock)
    assert set(ours.state_dict()) == set(stock.state_dict())
    ours.load_state_dict(stock.state_dict(), strict=True)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        expected, _ = stock(src, lengths, prev)
        actual, _ = ours(src, lengths, prev)
    assert torch.equal(actual, expected)


def test_presets_have_the_stock_parameter_counts():
    dictionary = make_dictionary(1000)
    ours, args = build("multilayer_transformer_wmt_en_de", "--share-all-embeddings", dictionary=dictionary)
    stock, _ = build_stock("transformer_wmt_en_de", "--share-all-embeddings", dictionary=dictionary)
    assert count_parameters(ours) == count_parameters(stock)
    small, args = build("multilayer_transformer_iwslt", dictionary=dictionary)
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_attention_heads) == (256, 1024, 4)
    assert (args.encoder_layers, args.decoder_layers) == (4, 4)
    # thesis small config: 4 x (4 d^2 + 2 d d_ff) + 4 x (8 d^2 + 2 d d_ff) weight matrices
    d, f = 256, 1024
    matrices = 4 * (4 * d * d + 2 * d * f) + 4 * (8 * d * d + 2 * d * f)
    embeddings = 3 * len(dictionary) * d  # source and target embeddings, untied output projection
    biases_and_norms = count_parameters(small) - matrices - embeddings
    assert 0 < biases_and_norms < 0.01 * matrices


@pytest.mark.parametrize("flags,read", [
    ((), ()), (("--joint-attention", "m-10"), ()), (("--aux-decoder-layers", "1"), ()),
    (("--aux-decoder-layers", "1", "--aux-fusion"), (1,)),
    (("--aux-decoder-layers", "1,2", "--aux-fusion"), (1, 2)),
    (("--aux-decoder-layers", "1,2", "--decode-from", "aux2"), (2,))])
def test_encoder_exposes_every_layer_and_beam_reordering_keeps_what_decoding_reads(flags, read):
    """The encoder's forward returns every layer; a beam reorder (every step of fairseq's beam
    search) carries only the layers decoding reads (those of the auxiliary decoders that run
    there), reordered, and None for the others, instead of copying L + 1 tensors per step."""
    dictionary = make_dictionary()
    model, args = build("multilayer_transformer", *SMALL, *flags, dictionary=dictionary)
    src, lengths, _ = random_batch(dictionary)
    with torch.no_grad():
        out = model.encoder(src, src_lengths=lengths, return_all_hiddens=False)
    states = out["encoder_states"]
    assert len(states) == args.encoder_layers + 1  # embeddings + every layer
    assert torch.equal(states[-1], out["encoder_out"][0])
    states = list(states)
    new_order = torch.tensor([2, 2, 0, 1])
    reordered = model.encoder.reorder_encoder_out(out, new_order)
    assert torch.equal(reordered["encoder_out"][0], out["encoder_out"][0].index_select(1, new_order))
    assert out["encoder_states"] == states  # the caller's layers are left as they were
    if not read:
        assert reordered["encoder_states"] == []
        return
    assert len(reordered["encoder_states"]) == args.encoder_layers + 1
    for i, (state, original) in enumerate(zip(reordered["encoder_states"], states)):
        if i in read:
            assert torch.equal(state, original.index_select(1, new_order))
        else:
            assert state is None
    # a second reorder (the next beam step) carries the same layers
    again = model.encoder.reorder_encoder_out(reordered, torch.tensor([3, 0, 1, 2]))
    assert [s is not None for s in again["encoder_states"]] == [i in read for i in range(len(states))]
    assert torch.equal(again["encoder_states"][read[0]],
                       states[read[0]].index_select(1, new_order).index_select(1, torch.tensor([3, 0, 1, 2])))


def test_beam_search_runs_with_the_stock_sequence_generator():
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, dictionary=dictionary)
    src, lengths, _ = random_batch(dictionary)
    generator = SequenceGenerator([model], dictionary, beam_size=3, max_len_b=8)
    hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hypos) == src.size(0) and all(len(h) == 3 for h in hypos)


@pytest.mark.slow
def test_stock_fairseq_generate_loads_our_checkpoint(tiny_trained):
    bin_dir, checkpoint = tiny_trained  # trained by fairseq-train (conftest)
    result = subprocess.run(["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--cpu", "--beam", "2",
                             "--path", checkpoint], capture_output=True, text=True, env=clean_env())
    assert result.returncode == 0, result.stderr[-2000:]
    assert "BLEU4" in result.stdout
