"""Pre-norm layers (``--encoder-normalize-before --decoder-normalize-before``) and fairseq's
activation checkpointing (``--checkpoint-activations``) with every row of the strategy table
and every option set, the sublayers that run right after self-attention (serial, AIF)
included:

* in pre-norm, incremental decoding equals the teacher-forced forward across a beam reorder,
  and fairseq's beam search returns the teacher-forced scores of each sentence alone;
* the pre-norm equations of the serial sublayers and of AIF, recomputed by hand from the
  layer's own modules (h = x + SelfAttn(LN(x)), then the sublayers on the residual stream);
* with checkpointing, a training step gives the same loss and the same gradient of every
  parameter as without, in post-norm and pre-norm, while the layers do recompute their
  forward in the backward pass.
"""
import pytest
import torch

from fairseq_ext import keys
from fairseq_ext.model_builder import make_dictionary
from joint_attention_reference import L_SMALL, PRE_NORM, perturb
from joint_attention_reference import PRE_NORM_OPTION_SETS as OPTION_SETS
from model_utils import SMALL, beam_search_rescored, build, full_and_incremental, random_batch

# the sets whose decoder layers run sublayers right after self-attention
AFTER_SELF_ATTENTION = ("serial", "aif", "serial+aif", "combined")


def model_of(flags, *extra, seed=0):
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, *flags, *extra, dictionary=dictionary, seed=seed)
    return perturb(model.double(), seed=seed + 1), dictionary


@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_pre_norm_incremental_decoding_equals_teacher_forcing(option_set):
    model, dictionary = model_of(OPTION_SETS[option_set], *PRE_NORM)
    assert all(layer.normalize_before for layer in model.decoder.layers)
    src, lengths, prev = random_batch(dictionary, beam=2)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    torch.testing.assert_close(incremental, full, atol=1e-5, rtol=0)  # fairseq log-softmaxes in fp32


@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_pre_norm_beam_search_returns_the_teacher_forced_scores(option_set):
    model, dictionary = model_of(OPTION_SETS[option_set], *PRE_NORM)
    src, lengths, _ = random_batch(dictionary, bsz=4, src_len=7, seed=3)
    beam_search_rescored(model, dictionary, src, lengths, max_len_b=10)


def by_hand(layer, x, memory, mask, aux=(), serial=None):
    """A pre-norm decoder layer recomputed from its own modules: self-attention, AIF and the
    serial sublayers on the residual stream, then the cross-attention and the FFN."""
    h = x + layer.self_attn(query=layer.self_attn_layer_norm(x), key=layer.self_attn_layer_norm(x),
                            value=layer.self_attn_layer_norm(x), attn_mask=mask)[0]
    if layer.aif is not None:
        h = h + sum(f @ w.weight.T for f, w in zip(aux, layer.aif.projections))
    if serial is not None:
        for i, (attn, norm) in enumerate(zip(serial.attentions, serial.layer_norms)):
            h = h + attn(query=norm(h), key=memory[:, :, i], value=memory[:, :, i], static_kv=True)[0]
    q = layer.encoder_attn_layer_norm(h)
    h = h + layer.encoder_attn(query=q, key=memory, value=memory, static_kv=True)[0]
    return h + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(h))))


@pytest.mark.parametrize("option_set", ["serial", "aif", "serial+aif"])
def test_pre_norm_equations_of_the_sublayers_after_self_attention(option_set):
    """Serial (Libovicky et al. 2018, Fig. 1a) and AIF (thesis Eq. 4.3) in a pre-norm layer:
    h = x + SelfAttn(LN(x)); h <- h + sum_i W^{a,i} f^i; h <- h + Att_i(LN_i(h), f^i) for
    i < n; then h + CrossAttn(LN(h), f^n) and the FFN, each on the residual stream."""
    flags = OPTION_SETS[option_set]
    model, _ = model_of(flags + (("--joint-attention-layers", str(L_SMALL)) if "serial" in flags else ()),
                        *PRE_NORM)
    model.eval()
    layer = model.decoder.layers[1]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 2, 32, generator=g, dtype=torch.float64)
    n = L_SMALL if "serial" in flags else 1
    memory = torch.randn(6, 2, n, 32, generator=g, dtype=torch.float64)
    if n == 1:
        memory = memory[:, :, 0]
    aux = [torch.randn(4, 2, 32, generator=g, dtype=torch.float64) for _ in model.decoder.aux_layers]
    mask = model.decoder.buffered_future_mask(x).double()
    with torch.no_grad(), model.decoder.step_context.step(aux if layer.aif is not None else []):
        actual = layer(x, memory, None, None, self_attn_mask=mask)[0]
        expected = by_hand(layer, x, memory, mask, aux, layer.serial_stack)
    torch.testing.assert_close(actual, expected, atol=1e-10, rtol=0)
    # and the sublayers do take part: without them the layer computes something else
    with torch.no_grad():
        plain = by_hand(layer, x, memory, mask, [torch.zeros_like(f) for f in aux], None)
    assert (actual - plain).abs().max() > 1e-3


def training_step(model, dictionary):
    """The loss of a teacher-forced forward (main and auxiliary outputs) and every gradient."""
    src, lengths, prev = random_batch(dictionary, bsz=3, seed=4)
    model.train()
    model.zero_grad(set_to_none=True)
    logits, extra = model(src, lengths, prev)
    loss = logits.logsumexp(-1).mean() + sum(a.logsumexp(-1).mean() for a in extra.get(keys.AUX_OUT) or [])
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("norm", [(), PRE_NORM], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("option_set", ["none", "m-10", "transparent", "ms"] + list(AFTER_SELF_ATTENTION))
def test_checkpoint_activations_give_the_same_loss_and_gradients(option_set, norm):
    reference, dictionary = model_of(OPTION_SETS[option_set], *norm)
    checkpointed, _ = model_of(OPTION_SETS[option_set], *norm, "--checkpoint-activations")
    checkpointed.load_state_dict(reference.state_dict())
    calls = []
    for layer in checkpointed.decoder.layers:
        layer.self_attn.register_forward_hook(lambda m, args, out: calls.append(torch.is_grad_enabled()))
    loss, grads = training_step(reference, dictionary)
    checkpointed_loss, checkpointed_grads = training_step(checkpointed, dictionary)
    # each main decoder layer ran twice: without autograd, then again in the backward pass
    assert calls == [False] * len(checkpointed.decoder.layers) + [True] * len(checkpointed.decoder.layers)
    torch.testing.assert_close(checkpointed_loss, loss, atol=1e-12, rtol=0)
    assert checkpointed_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(checkpointed_grads[name], grad, atol=1e-10, rtol=0, msg=name)
    if "--aux-fusion" in OPTION_SETS[option_set]:  # AIF's gradient reaches the auxiliary decoders
        assert any(name.startswith("decoder.aux_decoders.") for name in checkpointed_grads)
