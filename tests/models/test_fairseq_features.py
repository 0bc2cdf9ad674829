"""fairseq features that would silently misbehave with the plugin are refused (naming the
flags) or supported with a defined meaning: LayerDrop, layer pruning and cross-self-attention,
retain-dropout, a number of source sentences larger than the number of encoder layers,
auxiliary decoders with a criterion that ignores them, and an encoder without positions."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from fairseq_ext.errors import OptionError
from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel
from model_utils import MULTI30K_TRAIN_FLAGS, SMALL, build, make_dictionary, parse_model_args, random_batch


# --- LayerDrop, layer pruning, cross-self-attention ---------------------------------------
@pytest.mark.parametrize("flags,message", [
    (("--joint-attention", "m-10", "--encoder-layerdrop", "0.2"),
     "--encoder-layerdrop cannot be combined with --joint-attention m-10"),
    (("--aux-decoder-layers", "1", "--encoder-layerdrop", "0.2"),
     "--encoder-layerdrop cannot be combined with --aux-decoder-layers"),
    (("--joint-attention", "s-agg", "--encoder-layers-to-keep", "0,2"),
     "--encoder-layers-to-keep cannot be combined with --joint-attention s-agg"),
    (("--joint-attention", "transparent", "--decoder-layers-to-keep", "0"),
     "--decoder-layers-to-keep cannot be combined with --joint-attention transparent"),
    (("--joint-attention", "flat", "--no-cross-attention", "--cross-self-attention"),
     "--no-cross-attention cannot be combined with --joint-attention flat"),
    (("--joint-attention", "m-00", "--cross-self-attention"), "--cross-self-attention cannot be combined"),
    (("--decoder-self-attention", "dc", "--cross-self-attention"),
     "--cross-self-attention cannot be combined with --decoder-self-attention dc"),
    (("--decoder-self-attention", "mma", "--cross-self-attention"),
     "--cross-self-attention cannot be combined with --decoder-self-attention mma"),
])
def test_features_that_would_read_the_wrong_layer_are_refused(flags, message):
    with pytest.raises(OptionError, match=message):
        build("multilayer_transformer", *SMALL, *flags)


def test_the_features_still_work_where_nothing_reads_the_lower_layers():
    model, _ = build("multilayer_transformer", *SMALL, "--encoder-layerdrop", "0.2")
    assert model.encoder.encoder_layerdrop == 0.2
    model, _ = build("multilayer_transformer", *SMALL, "--no-cross-attention", "--cross-self-attention")
    src, lengths, prev = random_batch(model.decoder.dictionary)
    assert torch.isfinite(model(src, lengths, prev)[0]).all()


def test_every_dropout_is_fairseqs_so_retain_dropout_reaches_it():
    model, _ = build("multilayer_transformer", *SMALL, "--joint-attention", "c-agg", "--aux-decoder-layers", "1",
                     "--aux-fusion", "--encoder-self-attention", "dc", "--decoder-self-attention", "mma")
    plain = [name for name, m in model.named_modules() if isinstance(m, nn.Dropout)]
    assert not plain
    model.prepare_for_inference_(SimpleNamespace(generation=SimpleNamespace(retain_dropout=True,
                                                                           retain_dropout_modules=None)))
    aggregation_dropout = model.encoder.layer_aggregation.units[0].activation_dropout
    assert aggregation_dropout.apply_during_inference


# --- the number of source sentences is not a number of layers -----------------------------
def test_three_sources_with_a_two_layer_encoder():
    dictionary = make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary, num_source_sentences=3)
    flags = [f for f in SMALL]
    flags[flags.index("--encoder-layers") + 1] = "2"
    args = parse_model_args("multilayer_transformer", *flags, "--joint-attention", "hierarchical")
    model = MultilayerTransformerModel.build_model(args, task).eval()
    assert model.encoder.num_sources == 3 and len(model.encoder.encoders) == 3
    src, lengths, prev = random_batch(dictionary)
    extra = torch.stack([random_batch(dictionary, seed=s)[0] for s in (5, 6)], dim=1)
    out, _ = model(src, lengths, prev, extra_src_tokens=extra)
    assert torch.isfinite(out).all()


# --- multi-level supervision never trains without its losses -----------------------------
def test_ms_with_a_criterion_that_ignores_the_auxiliary_decoders_is_refused(multi30k_bin, tmp_path, monkeypatch):
    from model_utils import train_recording_validation
    flags = [f for f in MULTI30K_TRAIN_FLAGS]
    with pytest.raises(OptionError, match="--aux-decoder-layers 1 needs --criterion "
                                          "multi_output_label_smoothed_cross_entropy: with --criterion "
                                          "label_smoothed_cross_entropy"):
        train_recording_validation(multi30k_bin, tmp_path, monkeypatch, *flags, "--aux-decoder-layers", "1")
    assert not (tmp_path / "checkpoint_last.pt").exists()


def test_no_encoder_positional_embeddings_makes_the_encoder_order_blind():
    """MMA paper Table 3 (word order): without encoder positions the encoder is permutation
    equivariant (each token's output moves with it), the decoder keeps its positions, and the
    model equals one whose encoder positional embedding was removed by hand."""
    model, _ = build("multilayer_transformer_iwslt", *SMALL, "--no-encoder-positional-embeddings")
    reference, _ = build("multilayer_transformer_iwslt", *SMALL)
    assert model.encoder.embed_positions is None
    assert model.decoder.embed_positions is not None and reference.encoder.embed_positions is not None
    tokens = torch.tensor([[5, 6, 7, 8, 9, 10, 2]])
    perm = torch.tensor([3, 0, 5, 1, 4, 2, 6])  # keep EOS last
    lengths = torch.tensor([7])
    out = model.encoder(tokens, src_lengths=lengths)["encoder_out"][0]
    out_perm = model.encoder(tokens[:, perm], src_lengths=lengths)["encoder_out"][0]
    torch.testing.assert_close(out_perm, out[perm], rtol=1e-5, atol=1e-5)
    # with positions (the default) the same permutation changes every output
    ref = reference.encoder(tokens, src_lengths=lengths)["encoder_out"][0]
    ref_perm = reference.encoder(tokens[:, perm], src_lengths=lengths)["encoder_out"][0]
    assert (ref_perm - ref[perm]).abs().max() > 1e-2
    # identical to removing the reference's encoder positions by hand
    reference.load_state_dict(model.state_dict(), strict=False)
    reference.encoder.embed_positions = None
    torch.testing.assert_close(reference.encoder(tokens, src_lengths=lengths)["encoder_out"][0], out)
