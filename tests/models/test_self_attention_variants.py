"""DC and MMA self-attention in the assembled model (thesis Ch. 5, MMA paper,
word-translation paper): parameter deltas in the base config (thesis Table 5.2), the DC layer
ranges and the MMA heads of each layer, incremental decoding and beam search, causality,
the pre-classifier projection, the presets, settings refused at build, and (slow) DC + M-10 +
MS-1 + AIF training and decoding together. The modules' equations are tested in
tests/modules/test_dual_contextual_attention.py and test_mixed_multihead_attention.py."""
import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_ext.errors import OptionError
from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention
from fairseq_ext.modules.mixed_multihead_attention import MixedMultiheadAttention
from model_utils import (
    SMALL,
    beam_search_rescored,
    build,
    count_parameters,
    full_and_incremental,
    make_dictionary,
    random_batch,
)


def test_parameter_deltas_base_config():
    # 33,320 symbols make the shared-embedding base baseline the thesis' 61.2M
    dictionary = make_dictionary(33320)
    d = 512
    base, _ = build("multilayer_transformer_wmt_en_de", "--share-all-embeddings", dictionary=dictionary)
    assert abs(count_parameters(base) / 1e6 - 61.2) < 0.05
    enc_dc, _ = build("multilayer_transformer_dc_wmt_en_de", "--share-all-embeddings", "--dc-kernel-size", "2",
                      dictionary=dictionary)
    delta = count_parameters(enc_dc) - count_parameters(base)
    assert abs(delta - 6 * (4 + 2 * 2) * d * d) < 0.01 * delta  # +12.58M
    assert abs(count_parameters(enc_dc) / 1e6 - 73.9) < 0.15  # thesis Table 5.2
    f3, _ = build("multilayer_transformer_dc_wmt_en_de", "--share-all-embeddings", "--dc-kernel-size", "3", dictionary=dictionary)
    assert abs((count_parameters(f3) - count_parameters(base)) - 6 * (4 + 2 * 3) * d * d) < 0.01 * delta
    mma, _ = build("multilayer_transformer_mma_wmt_en_de", "--share-all-embeddings", dictionary=dictionary)
    assert count_parameters(mma) == count_parameters(base)
    proj, _ = build("multilayer_transformer_wmt_en_de", "--share-all-embeddings", "--pre-classifier-projection",
                    dictionary=dictionary)
    assert count_parameters(proj) - count_parameters(base) == d * d


@pytest.mark.parametrize("side,flag,layers,expected", [
    ("encoder", "--dc-encoder-layers", "1-2", [True, True, False]),
    ("encoder", "--dc-encoder-layers", "", [True, True, True]),
    ("decoder", "--dc-decoder-layers", "2", [False, True]),
])
def test_dc_layer_ranges(side, flag, layers, expected):
    model, _ = build("multilayer_transformer", *SMALL, f"--{side}-self-attention", "dc", flag, layers)
    stack = model.encoder.layers if side == "encoder" else model.decoder.layers
    assert [isinstance(layer.self_attn, DualContextualAttention) for layer in stack] == expected
    for layer, is_dc in zip(stack, expected):
        if is_dc and side == "decoder":
            assert layer.self_attn.causal


def test_mma_heads_in_the_model():
    model, _ = build("multilayer_transformer", *SMALL, "--encoder-self-attention", "mma", "--mma-heads", "G,L,L,L",
                     "--mma-window", "2")
    attn = model.encoder.layers[0].self_attn
    assert isinstance(attn, MixedMultiheadAttention)
    assert attn.head_types == ["G", "L", "L", "L"] and attn.window == 2
    assert isinstance(model.decoder.layers[0].self_attn, MultiheadAttention)
    assert not isinstance(model.decoder.layers[0].self_attn, MixedMultiheadAttention)
    # inside fairseq's encoder layer: all-global heads are the standard model with the same
    # weights (Eq. 8, M = 0), and a local head changes exactly what its window hides
    dictionary = model.decoder.dictionary
    standard, _ = build("multilayer_transformer", *SMALL, dictionary=dictionary)
    global_only, _ = build("multilayer_transformer", *SMALL, "--encoder-self-attention", "mma", "--mma-heads",
                           "G,G,G,G", dictionary=dictionary)
    global_only.load_state_dict(standard.state_dict())
    model.load_state_dict(standard.state_dict())
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        torch.testing.assert_close(global_only(src, lengths, prev)[0], standard(src, lengths, prev)[0])
        layer = model.encoder.layers[0]
        x = torch.randn(6, 2, 32)
        out = layer(x, None)
        # recompute the layer by hand (post-norm, dropout off) around the MMA sublayer
        attn, _ = layer.self_attn(x, x, x)
        h = layer.self_attn_layer_norm(x + attn)
        expected = layer.final_layer_norm(h + layer.fc2(layer.activation_fn(layer.fc1(h))))
        torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("flags", [
    ("--encoder-self-attention", "dc"),
    ("--encoder-self-attention", "dc", "--dc-kernel-size", "3"),  # its window reaches the left padding
    ("--decoder-self-attention", "dc", "--dc-kernel-size", "2"),
    ("--decoder-self-attention", "dc", "--dc-kernel-size", "3"),
    ("--decoder-self-attention", "dc", "--dc-kernel-size", "4", "--dc-decoder-layers", "1"),
    ("--encoder-self-attention", "mma"),
    ("--decoder-self-attention", "mma", "--decoder-mma-heads", "L,B"),
    ("--pre-classifier-projection", "--share-all-embeddings"),
    ("--encoder-self-attention", "dc", "--decoder-self-attention", "dc", "--joint-attention", "m-10",
     "--aux-decoder-layers", "1", "--aux-fusion", "--pre-classifier-projection"),
])
def test_incremental_equals_full_and_beam_search_scores(flags):
    model, _ = build("multilayer_transformer", *SMALL, *flags)
    dictionary = model.decoder.dictionary
    src, lengths, prev = random_batch(dictionary, beam=2)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    assert torch.allclose(full, incremental, atol=1e-5)
    src, lengths, _ = random_batch(dictionary, bsz=4, seed=3)
    beam_search_rescored(model, dictionary, src, lengths)  # beam scores = teacher-forced scores


@pytest.mark.parametrize("kernel", ["2", "3"])
def test_dc_decoder_is_causal_in_the_model(kernel):
    model, _ = build("multilayer_transformer", *SMALL, "--decoder-self-attention", "dc", "--dc-kernel-size", kernel)
    src, lengths, prev = random_batch(model.decoder.dictionary)
    changed = prev.clone()
    changed[:, 3] = (changed[:, 3] + 1 - model.decoder.dictionary.nspecial) % (
        len(model.decoder.dictionary) - model.decoder.dictionary.nspecial) + model.decoder.dictionary.nspecial
    with torch.no_grad():
        a, _ = model(src, lengths, prev)
        b, _ = model(src, lengths, changed)
    assert torch.equal(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])
    full_a, inc_a = full_and_incremental(model, src, lengths, prev)
    full_b, inc_b = full_and_incremental(model, src, lengths, changed)
    assert torch.allclose(inc_a[:, :3], inc_b[:, :3], atol=0)


def test_pre_classifier_projection_with_shared_embeddings():
    model, _ = build("multilayer_transformer", *SMALL, "--pre-classifier-projection", "--share-all-embeddings")
    decoder = model.decoder
    assert decoder.output_projection.weight is decoder.embed_tokens.weight is model.encoder.embed_tokens.weight
    assert decoder.pre_classifier.bias is None
    features = torch.randn(2, 3, 32)
    expected = features @ decoder.pre_classifier.weight.T @ decoder.embed_tokens.weight.T
    assert torch.allclose(decoder.output_layer(features), expected, atol=1e-5)


def test_aux_decoders_share_the_pre_classifier_and_output_projection():
    model, _ = build("multilayer_transformer", *SMALL, "--pre-classifier-projection", "--aux-decoder-layers", "1")
    aux = model.decoder.aux_decoders[0]
    assert aux.pre_classifier is model.decoder.pre_classifier
    assert aux.output_projection is model.decoder.output_projection
    assert aux.embed_tokens is model.decoder.embed_tokens


def test_presets():
    _, args = build("multilayer_transformer_deep_enc_shallow_dec", dictionary=make_dictionary())
    assert (args.encoder_layers, args.decoder_layers, args.encoder_embed_dim, args.encoder_ffn_embed_dim) == (10, 2, 512, 2048)
    _, args = build("multilayer_transformer_dc_iwslt")
    assert args.encoder_self_attention == "dc" and args.decoder_self_attention == "standard"
    # thesis Table 5.1: the Ch. 5 IWSLT config has d_ff 512; f = 2 reproduces Table 5.2's count
    assert args.encoder_embed_dim == 256 and args.encoder_ffn_embed_dim == 512 and args.dc_kernel_size == 2
    _, args = build("multilayer_transformer_mma_iwslt")
    assert args.encoder_self_attention == "mma"
    # the MMA paper's IWSLT setup: 6+6 layers, d 512, FFN 1024, 4 heads (one per function), dropout 0.3
    assert (args.encoder_layers, args.decoder_layers, args.encoder_embed_dim, args.encoder_ffn_embed_dim,
            args.encoder_attention_heads, args.dropout) == (6, 6, 512, 1024, 4, 0.3)
    model, args = build("multilayer_transformer_mma_wmt_en_de", dictionary=make_dictionary())
    assert model.encoder.layers[0].self_attn.head_types == list("GGLLFFBB")  # each function twice
    for e, d in ((6, 6), (7, 5), (8, 4), (9, 3), (10, 2), (11, 1)):  # word-translation paper, Table 4
        _, args = build(f"multilayer_transformer_enc{e}_dec{d}", dictionary=make_dictionary())
        assert (args.encoder_layers, args.decoder_layers, args.encoder_embed_dim) == (e, d, 512)
    _, args = build("multilayer_transformer_dc_iwslt", "--dc-kernel-size", "3")  # the command line wins over presets
    assert args.dc_kernel_size == 3


@pytest.mark.parametrize("flags,message", [
    (("--encoder-self-attention", "mma", "--mma-heads", "G,L,F"), "--mma-heads"),
    (("--encoder-self-attention", "mma", "--mma-heads", "G,L,X,B"), "--mma-heads"),
    (("--encoder-self-attention", "mma", "--mma-heads", "G,L,F"), "^--mma-heads"),
    (("--decoder-self-attention", "mma", "--decoder-mma-heads", "G,B"), "^--decoder-mma-heads"),
    (("--decoder-self-attention", "mma", "--decoder-mma-heads", "F,B"), "^--decoder-mma-heads"),
    (("--decoder-self-attention", "mma", "--decoder-mma-heads", "L,B,L"), "^--decoder-mma-heads"),
    (("--decoder-self-attention", "mma", "--decoder-mma-heads", "L,X"), "^--decoder-mma-heads"),
    # a head spec without MMA in use is refused, as --dc-kernel-size 0 is
    (("--mma-heads", "G,L,F,B"), "^--mma-heads 'G,L,F,B' needs --encoder-self-attention mma"),
    (("--decoder-mma-heads", "L,B"), "^--decoder-mma-heads 'L,B' needs --decoder-self-attention mma"),
    (("--encoder-self-attention", "mma", "--decoder-mma-heads", "L,B"), "^--decoder-mma-heads"),
    (("--encoder-self-attention", "dc", "--dc-encoder-layers", "2-5"), "--dc-encoder-layers"),
    (("--decoder-self-attention", "dc", "--dc-decoder-layers", "a-b"), "--dc-decoder-layers"),
    (("--encoder-self-attention", "dc", "--dc-kernel-size", "0"), "--dc-kernel-size"),
    (("--encoder-self-attention", "mma", "--mma-window", "-1"), "--mma-window"),
    (("--encoder-attention-heads", "5"), "--encoder-attention-heads"),
])
def test_invalid_settings_fail_at_build(flags, message):
    with pytest.raises(OptionError, match=message):
        build("multilayer_transformer", *SMALL, *flags)


@pytest.mark.slow
def test_dc_encoder_m10_ms1_aif_trains_and_decodes(multi30k_bin, tmp_path, monkeypatch):
    """Everything composes: DC encoder + M-10 + MS-1 + AIF trains 60 updates (four epochs of
    the Multi30k slice) with falling validation loss, and translates with beam search."""
    from model_utils import MULTI30K_TRAIN_FLAGS, USER_DIR, generate_in_process, train_recording_validation

    losses = train_recording_validation(
        multi30k_bin, tmp_path, monkeypatch, *MULTI30K_TRAIN_FLAGS, "--max-update", "60",
        "--encoder-self-attention", "dc", "--joint-attention", "m-10", "--aux-decoder-layers", "1", "--aux-fusion",
        "--criterion", "multi_output_label_smoothed_cross_entropy", "--no-epoch-checkpoints")
    assert len(losses) >= 3 and losses[-1] < losses[0] - 1.0, losses
    printed = generate_in_process([multi30k_bin, "--user-dir", USER_DIR, "--path", str(tmp_path / "checkpoint_last.pt"),
                                   "--gen-subset", "valid", "--beam", "4", "--batch-size", "100", "--max-len-a", "1.2",
                                   "--max-len-b", "10", "--cpu"])
    hypotheses = [line for line in printed.splitlines() if line.startswith("H-")]
    assert len(hypotheses) >= 290 and "BLEU4" in printed  # (a few empty lines of the slice are skipped)


def test_enc_dc_preset_reproduces_the_thesis_parameter_count():
    """Thesis Table 5.2: Enc-DC, base config, shared embeddings (33,320 types): 73.9M; the
    default kernel f = 2 gives (4 + 2f) d^2 more per encoder layer than the 61.2M baseline."""
    dictionary = make_dictionary(33320 - 4)
    with torch.device("meta"):
        model, _ = build("multilayer_transformer_dc_wmt_en_de", "--share-all-embeddings", dictionary=dictionary)
    total = count_parameters(model)
    assert abs(total / 1e6 - 73.9) < 0.15, total
