"""Multi-level supervision in the model (thesis Ch. 4, Eq. 4.1-4.3): parameter counts of the
auxiliary decoders and AIF (thesis Tables 4.4 and 4.6a), incremental decoding and beam search,
auxiliary decoders that are stock decoders over their encoder layer, the AIF equation and
what AIF reads in training and in beam search, settings refused at build, and (slow)
training, stripping the auxiliary decoders and translating identically. The loss is tested
in tests/criterions/."""
import logging

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_ext.strip_aux import strip_aux_decoders
from model_utils import (
    SMALL,
    TINY_TRAIN_FLAGS,
    USER_DIR,
    beam_search_rescored,
    build,
    build_stock,
    count_parameters,
    full_and_incremental,
    generate_in_process,
    make_dictionary,
    make_tiny_parallel_data,
    random_batch,
    train_in_process,
)


# --- parameter counts (thesis Tables 4.4 / 4.6a) ---------------------------------------------
def test_parameter_deltas_base_config():
    dictionary = make_dictionary(100)
    d, f, layers = 512, 2048, 6
    base, _ = build("multilayer_transformer_wmt_en_de", "--share-all-embeddings", dictionary=dictionary)
    ms1, _ = build("multilayer_transformer_ms_wmt_en_de", "--share-all-embeddings", dictionary=dictionary)
    aif, _ = build("multilayer_transformer_ms_wmt_en_de", "--share-all-embeddings", "--aux-fusion", dictionary=dictionary)
    decoder_stack = count_parameters(base.decoder) - count_parameters(base.decoder.embed_tokens)
    assert count_parameters(ms1) - count_parameters(base) == decoder_stack  # one aux decoder = one decoder stack
    assert abs(decoder_stack - layers * (8 * d * d + 2 * d * f)) < 0.01 * decoder_stack  # 25.17M
    assert count_parameters(aif) - count_parameters(ms1) == layers * d * d  # AIF: d^2 per main layer per aux decoder (1.57M)


def test_parameter_counts_small_config_table_4_6a():
    # the vocabulary that makes the small-config baseline 12.8M with shared embeddings
    dictionary = make_dictionary(21200)
    flags = ("--share-all-embeddings",)
    totals = {}
    for name, extra in [("baseline", ()), ("MS-1", ("--aux-decoder-layers", "1")),
                        ("MS-1+AIF", ("--aux-decoder-layers", "1", "--aux-fusion")),
                        ("MS-13", ("--aux-decoder-layers", "1,3")),
                        ("MS-13+AIF", ("--aux-decoder-layers", "1,3", "--aux-fusion")),
                        ("MS-123", ("--aux-decoder-layers", "1,2,3")),
                        ("MS-123+AIF", ("--aux-decoder-layers", "1,2,3", "--aux-fusion"))]:
        model, _ = build("multilayer_transformer_iwslt", *flags, *extra, dictionary=dictionary)
        totals[name] = count_parameters(model) / 1e6
    expected = {"baseline": 12.8, "MS-1": 17.0, "MS-1+AIF": 17.3, "MS-13": 21.2, "MS-13+AIF": 21.7,
                "MS-123": 25.4, "MS-123+AIF": 26.2}
    for name, value in expected.items():
        assert abs(totals[name] - value) < 0.1, (name, totals[name], value)
    assert abs((totals["MS-1"] - totals["baseline"]) - 4.2) < 0.05
    assert abs((totals["MS-1+AIF"] - totals["MS-1"]) - 0.26) < 0.01


# --- incremental decoding and beam search ----------------------------------------------------------
@pytest.mark.parametrize("aux_layers", ["1", "1,3", "1,2,3"])
@pytest.mark.parametrize("fusion", [False, True])
def test_incremental_equals_full_forward(aux_layers, fusion):
    flags = list(SMALL) + ["--encoder-layers", "4", "--aux-decoder-layers", aux_layers] + (["--aux-fusion"] if fusion else [])
    model, _ = build("multilayer_transformer", *flags)
    src, lengths, prev = random_batch(model.decoder.dictionary, beam=2)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    assert torch.allclose(full, incremental, atol=1e-5)


@pytest.mark.parametrize("flags", [("--aux-decoder-layers", "1"), ("--aux-decoder-layers", "1,2"),
                                   ("--aux-decoder-layers", "1,2", "--aux-fusion"),
                                   ("--aux-decoder-layers", "1", "--aux-fusion", "--joint-attention", "m-00"),
                                   ("--aux-decoder-layers", "2", "--decode-from", "aux2")])
def test_beam_search_scores_are_the_teacher_forced_scores(flags):
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, *flags, dictionary=dictionary)
    src, lengths, _ = random_batch(dictionary, bsz=4, seed=3)
    beam_search_rescored(model, dictionary, src, lengths)


def test_without_fusion_beam_search_runs_only_the_main_decoder():
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", dictionary=dictionary)
    calls = []
    for aux in model.decoder.aux_decoders:
        aux.layers[0].register_forward_hook(lambda *a: calls.append(1))
    src, lengths, _ = random_batch(dictionary)
    SequenceGenerator([model], dictionary, beam_size=3, max_len_b=8).forward(
        {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert calls == []


def test_aif_beam_search_projects_only_the_main_decoder_to_the_vocabulary():
    """With AIF the auxiliary decoders run every step, but only their features are fused:
    the vocabulary projection runs once per step (the main decoder's), not once per decoder."""
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", "--aux-fusion",
                     dictionary=dictionary)
    projected = []
    model.decoder.output_projection.register_forward_hook(lambda m, i, o: projected.append(o.size(-2)))
    aux_steps = []
    model.decoder.aux_decoders[1].layers[-1].register_forward_hook(lambda *a: aux_steps.append(1))
    src, lengths, _ = random_batch(dictionary)
    SequenceGenerator([model], dictionary, beam_size=3, max_len_b=8).forward(
        {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(aux_steps) > 1 and len(projected) == len(aux_steps)  # one projection per step
    assert set(projected) == {1}  # of the step's one position
    # a teacher-forced forward still gives every decoder's logits to the multi-output loss
    projected.clear()
    src, lengths, prev = random_batch(dictionary)
    _, extra = model(src, lengths, prev)
    assert len(projected) == 3 and len(extra["aux_out"]) == 2


def test_aux_decoders_are_stock_decoders_reading_their_encoder_layer():
    """Auxiliary decoder i (thesis Eq. 4.1) is a standard decoder over H^{l_i}, the output of
    encoder layer l_i: fairseq's own TransformerDecoder with its weights, given that layer
    and the source padding mask, returns the same logits; --decode-from aux2 returns them."""
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", dictionary=dictionary)
    aux2, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", "--decode-from", "aux2",
                    dictionary=dictionary)
    aux2.load_state_dict(model.state_dict())
    stock, _ = build_stock("transformer", *SMALL, dictionary=dictionary)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        _, extra = model(src, lengths, prev)
        logits, _ = aux2(src, lengths, prev)
        states = model.encoder(src, src_lengths=lengths)["encoder_states"]  # H^0 (embeddings), H^1 .. H^L
        for i, layer in enumerate((1, 2)):
            stock.decoder.load_state_dict(model.decoder.aux_decoders[i].state_dict())
            memory = {"encoder_out": [states[layer]], "encoder_padding_mask": [src.eq(dictionary.pad())]}
            expected, _ = stock.decoder(prev, encoder_out=memory)
            torch.testing.assert_close(extra["aux_out"][i], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, extra["aux_out"][1], atol=1e-6, rtol=0)
    full, incremental = full_and_incremental(aux2, src, lengths, prev)
    assert torch.allclose(full, incremental, atol=1e-5)


def test_aif_with_zero_weights_is_the_ms_main_decoder():
    """The "ind-decoder" of thesis Eq. 4.4-4.7."""
    dictionary = make_dictionary()
    ms, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", dictionary=dictionary, seed=5)
    aif, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", "--aux-fusion",
                   dictionary=dictionary, seed=6)
    missing, unexpected = aif.load_state_dict(ms.state_dict(), strict=False)
    assert unexpected == [] and missing and all(".aif." in k for k in missing)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        expected, _ = ms(src, lengths, prev)
        fused, _ = aif(src, lengths, prev)
        assert not torch.allclose(fused, expected, atol=1e-3)  # random W^a change the output
        for layer in aif.decoder.layers:
            for proj in layer.aif.projections:
                proj.weight.zero_()
        actual, _ = aif(src, lengths, prev)
    assert torch.allclose(actual, expected, atol=1e-6)


def test_aif_equation_in_a_decoder_layer():
    """h_l <- h_l + sum_i W^{a,i}_l f^i right after the self-attention sublayer (Eq. 4.2-4.3)."""
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", "--aux-fusion",
                     dictionary=dictionary)
    layer = model.decoder.layers[0]
    x = torch.randn(4, 2, 32)
    aux = [torch.randn(4, 2, 32), torch.randn(4, 2, 32)]
    captured = {}
    layer.encoder_attn.register_forward_hook(lambda m, args, kwargs, out: captured.update(q=kwargs["query"]),
                                             with_kwargs=True)
    memory = torch.randn(6, 2, 32)
    with torch.no_grad(), model.decoder.step_context.step(aux):
        layer(x, memory, None, None, self_attn_mask=model.decoder.buffered_future_mask(x))
        sa, _ = layer.self_attn(query=x, key=x, value=x, attn_mask=model.decoder.buffered_future_mask(x))
        h = layer.self_attn_layer_norm(x + sa)  # outside the layer's forward the hook runs nothing
    expected = h + aux[0] @ layer.aif.projections[0].weight.T + aux[1] @ layer.aif.projections[1].weight.T
    assert torch.allclose(captured["q"], expected, atol=1e-5)


def _record_aif_and_aux(model):
    """Record what every AIF unit receives, and what every auxiliary decoder returns."""
    seen, produced = [], []
    for layer in model.decoder.layers:
        layer.aif.register_forward_hook(lambda m, args, out: seen.append([f.clone() for f in args[1]]))
    for aux in model.decoder.aux_decoders:
        original = aux.extract_features

        def recording(*args, _original=original, **kwargs):
            features, extra = _original(*args, **kwargs)
            produced.append(features.clone())
            return features, extra
        aux.extract_features = recording
    return seen, produced


def test_aif_reads_the_real_auxiliary_decoders_in_training():
    """Every main-decoder layer fuses the final states of the auxiliary decoders themselves
    (not features from elsewhere), computed from their own encoder layers."""
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", "--aux-fusion",
                     dictionary=dictionary)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        expected = [model.decoder.aux_decoders[i].extract_features(
            prev, model.decoder.aux_encoder_out(encoder_out, i))[0].transpose(0, 1) for i in range(2)]
        seen, _ = _record_aif_and_aux(model)
        model(src, lengths, prev)
    assert len(seen) == len(model.decoder.layers)
    for fused in seen:
        for got, want in zip(fused, expected):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_aif_reads_the_real_auxiliary_decoders_in_beam_search():
    """In beam search the auxiliary decoders run step by step in lock-step with the main
    decoder; at every step each AIF unit receives exactly what they returned for that step."""
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", "--aux-fusion",
                     dictionary=dictionary)
    seen, produced = _record_aif_and_aux(model)
    src, lengths, _ = random_batch(dictionary)
    generator = SequenceGenerator([model], dictionary, beam_size=3, max_len_b=6)
    with torch.no_grad():
        generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    steps = len(produced) // 2
    assert steps >= 3 and len(seen) == steps * len(model.decoder.layers)
    for t in range(steps):
        aux_t = [produced[2 * t].transpose(0, 1), produced[2 * t + 1].transpose(0, 1)]  # 1 x B x C each
        for fused in seen[t * len(model.decoder.layers):(t + 1) * len(model.decoder.layers)]:
            for got, want in zip(fused, aux_t):
                assert torch.equal(got, want)


# --- build-time validation ------------------------------------------------------------------------
@pytest.mark.parametrize("flags,message", [
    (("--aux-decoder-layers", "3"), "--aux-decoder-layers"),  # == L
    (("--aux-decoder-layers", "0"), "--aux-decoder-layers"),
    (("--aux-decoder-layers", "1,1"), "duplicate"),
    (("--aux-decoder-layers", "1,x"), "--aux-decoder-layers"),
    (("--aux-fusion",), "--aux-fusion"),
    (("--aux-decoder-layers", "1", "--decode-from", "aux2"), "--decode-from"),
    (("--aux-decoder-layers", "1", "--decode-from", "bogus"), "--decode-from"),
])
def test_invalid_settings_fail_at_build(flags, message):
    with pytest.raises(ValueError, match=message):
        build("multilayer_transformer", *SMALL, *flags)


# --- stripping and end-to-end --------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_bin(tmp_path_factory):
    return make_tiny_parallel_data(str(tmp_path_factory.mktemp("tiny")))


def generate(bin_dir, path, *extra):
    """The H- and D- lines of fairseq-generate --beam 3 (in this process)."""
    printed = generate_in_process([bin_dir, "--user-dir", USER_DIR, "--cpu", "--beam", "3", "--path", str(path),
                                   *extra])
    return [line for line in printed.splitlines() if line.startswith(("H-", "D-"))], printed


@pytest.mark.slow
def test_train_strip_and_translate_identically(tiny_bin, tmp_path, caplog):
    save = tmp_path / "ms"
    with caplog.at_level(logging.INFO):
        train_in_process([tiny_bin, "--user-dir", USER_DIR, "--arch", "multilayer_transformer", *TINY_TRAIN_FLAGS,
                          "--aux-decoder-layers", "1", "--criterion", "multi_output_label_smoothed_cross_entropy",
                          "--label-smoothing", "0.1", "--aux-loss-weight", "0.5", "--max-update", "5",
                          "--save-dir", str(save)])
    assert "aux1_loss" in caplog.text and "main_loss" in caplog.text
    state = torch.load(save / "checkpoint_last.pt", weights_only=True)
    removed = strip_aux_decoders(state)
    assert removed > 0 and not any("aux_decoders" in k for k in state["model"])
    torch.save(state, save / "stripped.pt")
    full, _ = generate(tiny_bin, save / "checkpoint_last.pt")
    assert full and generate(tiny_bin, save / "stripped.pt")[0] == full
    assert generate(tiny_bin, save / "checkpoint_last.pt", "--model-overrides", "{'decode_from': 'aux1'}")[0]


@pytest.mark.slow
def test_m00_ms1_aif_trains_and_decodes(tiny_bin, tmp_path):
    save = tmp_path / "combo"
    train_in_process([tiny_bin, "--user-dir", USER_DIR, "--arch", "multilayer_transformer", *TINY_TRAIN_FLAGS,
                      "--joint-attention", "m-00", "--aux-decoder-layers", "1", "--aux-fusion",
                      "--criterion", "multi_output_label_smoothed_cross_entropy", "--max-update", "5",
                      "--save-dir", str(save)])
    assert "BLEU4" in generate(tiny_bin, save / "checkpoint_last.pt")[1]


