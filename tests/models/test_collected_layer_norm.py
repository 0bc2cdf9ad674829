"""--collected-layer-norm: in a pre-norm encoder the collected layers below the top are
residual streams; each gets a LayerNorm of its own before joint attention reads it (the top
one is the encoder's final LayerNorm). Checked against a recomputation from the encoder's
states, with incremental decoding equal to the full forward and fairseq's beam search."""
from types import SimpleNamespace

import pytest
import torch

from fairseq_ext.errors import OptionError
from joint_attention_reference import perturb
from model_utils import SMALL, beam_search_rescored, build, full_and_incremental, make_dictionary, random_batch

PRE_NORM = ("--encoder-normalize-before", "--decoder-normalize-before")


@pytest.mark.parametrize("strategy", ["m-10", "s-agg", "hierarchical", "transparent"])
def test_each_collected_layer_below_the_top_is_normalised(strategy):
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, *PRE_NORM, "--joint-attention", strategy,
                     "--collected-layer-norm", dictionary=dictionary)
    model = perturb(model.double(), seed=2)
    norms = model.encoder.collected_layer_norms
    layers = len(model.encoder.layers)
    # transparent: H^1..H^{L-1}, the embedding state H^0 as it is (DLCL's default)
    assert len(norms) == (layers - 1 if strategy == "transparent" else model.encoder.options.num_joint_layers - 1)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        out = model.encoder(src, src_lengths=lengths)
        states = list(out["encoder_states"])
        states[-1] = out["encoder_out"][0]  # the top: the final LayerNorm's output
        first = len(states) - 1 - len(norms)
        read = states[:first] + [norm(s) for norm, s in zip(norms, states[first:-1])] + states[-1:]
        if strategy == "m-10":  # the stacked memory is the collected layers themselves
            n = model.encoder.options.num_joint_layers
            torch.testing.assert_close(out["joint_memory"][0], torch.stack(read[-n:], dim=2), atol=1e-12, rtol=0)
        plain, _ = build("multilayer_transformer", *SMALL, *PRE_NORM, "--joint-attention", strategy,
                         dictionary=dictionary)
        plain = plain.double()
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if "collected_layer_norms" not in k})
        assert not torch.allclose(plain.encoder(src, src_lengths=lengths)["joint_memory"][0], out["joint_memory"][0])
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2)
    torch.testing.assert_close(full, incremental, atol=1e-6, rtol=0)
    beam_search_rescored(model.float(), dictionary, src, lengths)


def test_it_needs_a_pre_norm_encoder_and_several_layers():
    with pytest.raises(OptionError, match="--collected-layer-norm needs --encoder-normalize-before"):
        build("multilayer_transformer", *SMALL, "--joint-attention", "m-10", "--collected-layer-norm")
    with pytest.raises(OptionError, match="--collected-layer-norm needs a --joint-attention strategy"):
        build("multilayer_transformer", *SMALL, *PRE_NORM, "--collected-layer-norm")


def test_merger_dropout_drops_transparent_mixing_weights_in_training_only():
    """softmax(Dropout_p(w + 1/(L+1))) in training (Lingvo's WeightedSumLayer), softmax(w) in evaluation,
    and in evaluation with --retain-dropout; refused for other strategies."""
    from fairseq_ext.modules.transparent_attention import TransparentCombination

    mix = TransparentCombination(4, 3, merger_dropout=0.5)
    with torch.no_grad():
        mix.weight.copy_(torch.randn(4, 3))
    states = [torch.randn(5, 2, 8) for _ in range(4)]
    stacked = torch.stack(states, dim=2)
    mix.eval()
    expected = torch.einsum("jbic,im->jbmc", stacked, torch.softmax(mix.weight, dim=0))
    torch.testing.assert_close(mix(states), expected)
    mix.train()
    torch.manual_seed(3)
    got = mix(states)
    torch.manual_seed(3)
    dropped = torch.nn.functional.dropout(mix.weight + 0.25, 0.5, True)
    torch.testing.assert_close(got, torch.einsum("jbic,im->jbmc", stacked, torch.softmax(dropped, dim=0)))
    assert not torch.allclose(got, expected)
    with torch.no_grad():  # at initialisation a dropped state keeps e^0 against e^(2 * 1/4): dropout acts
        mix.weight.zero_()
    assert not torch.allclose(mix(states), stacked.mean(2, keepdim=True).expand_as(got))
    model, _ = build("multilayer_transformer", *SMALL, "--joint-attention", "transparent", "--merger-dropout", "0.3")
    assert model.encoder.transparent.merger_dropout.p == 0.3
    model.eval()
    model.prepare_for_inference_(SimpleNamespace(generation=SimpleNamespace(retain_dropout=True,
                                                                           retain_dropout_modules=None)))
    assert model.encoder.transparent.merger_dropout.apply_during_inference
    with pytest.raises(OptionError, match="--merger-dropout applies to --joint-attention transparent"):
        build("multilayer_transformer", *SMALL, "--joint-attention", "s-agg", "--merger-dropout", "0.3")
