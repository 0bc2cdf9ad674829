"""Dual Contextual module (thesis Ch. 5, Eq. 5.4-5.7) against a plain-torch re-computation,
plus causality, incremental decoding with beam reordering, padding and parameter count."""
import math

import pytest
import torch
import torch.nn.functional as F
from fairseq.modules.multihead_attention import MultiheadAttention

from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention
from model_utils import count_parameters

D, H = 16, 4


def make_dc(kernel_size, causal, seed=0):
    torch.manual_seed(seed)
    m = DualContextualAttention(D, H, kernel_size=kernel_size, causal=causal).double().eval()
    with torch.no_grad():  # random everything, LayerNorm and biases included
        for p in m.parameters():
            p.normal_(0.0, 0.4)
    return m


def future_mask(length):
    return torch.triu(torch.full((length, length), float("-inf"), dtype=torch.double), 1)


def reference_dc(m, r, pad, causal, with_weights=False):
    """Eq. 5.4-5.6 written out: windows [r_{t-a} .. r_{t+b}] times W^r in R^{f d x 2d}, GLU,
    LayerNorm; FI per head with explicit masks; [h_l ; h_g] W_z + b_z. With
    ``with_weights`` also the global FI unit's softmax weights, H x B x T x T."""
    length, bsz, dim = r.shape
    f = m.kernel_size
    dk = dim // H
    x = r.clone()
    if pad is not None:
        x[pad.t()] = 0.0
    left, right = (f - 1, 0) if causal else ((f - 1) // 2, f // 2)
    w_r = m.conv.weight.permute(2, 1, 0).reshape(f * dim, 2 * dim)  # row k*d + c = tap k, channel c
    xp = torch.cat([x.new_zeros(left, bsz, dim), x, x.new_zeros(right, bsz, dim)])
    r_hat = []
    for t in range(length):
        a, b = (torch.cat([xp[t + k] for k in range(f)], dim=-1) @ w_r + m.conv.bias).chunk(2, dim=-1)
        r_hat.append(a * torch.sigmoid(b))  # GLU
    ln = m.lc_layer_norm
    lc = F.layer_norm(torch.stack(r_hat) + r, (dim,), ln.weight, ln.bias, eps=1e-5)

    blocked = torch.zeros(bsz, length, length, dtype=torch.bool)
    if pad is not None:
        blocked |= pad[:, None, :]
    if causal:
        blocked |= torch.ones(length, length, dtype=torch.bool).triu(1)

    def fi(unit, a_in, b_in):
        heads, weights = [], []
        for h in range(H):
            s = slice(h * dk, (h + 1) * dk)
            q = F.linear(a_in, unit.q_proj.weight[s], unit.q_proj.bias[s])
            k = F.linear(b_in, unit.k_proj.weight[s], unit.k_proj.bias[s])
            v = F.linear(b_in, unit.v_proj.weight[s], unit.v_proj.bias[s])
            logits = torch.einsum("tbd,sbd->bts", q, k) / math.sqrt(dk)
            att = logits.masked_fill(blocked, float("-inf")).softmax(dim=-1)
            heads.append(torch.einsum("bts,sbd->tbd", att, v))
            weights.append(att)
        return torch.cat(heads, dim=-1), torch.stack(weights)

    (h_l, _), (h_g, global_weights) = fi(m.local_fi, r, lc), fi(m.global_fi, r, r)
    z_hat = F.linear(torch.cat([h_l, h_g], dim=-1), m.out_proj.weight, m.out_proj.bias)
    return (z_hat, global_weights) if with_weights else z_hat


def run_incremental(m, x, pad, reorder_at=None, new_order=None):
    """Feed x (T x B x C) one step at a time; optionally reorder the cache before step
    ``reorder_at`` and continue with the reordered batch. Returns the T outputs."""
    state = {}
    outs = []
    for t in range(x.size(0)):
        if t == reorder_at:
            m.reorder_incremental_state(state, new_order)
            x, pad = x[:, new_order], (pad[new_order] if pad is not None else None)
        step_pad = pad[:, t : t + 1] if pad is not None else None
        out, _ = m(x[t : t + 1], x[t : t + 1], x[t : t + 1], key_padding_mask=step_pad,
                   incremental_state=state, need_weights=False, attn_mask=None)
        outs.append(out)
    return outs


@pytest.mark.parametrize("kernel_size", [2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_equations(kernel_size, causal):
    m = make_dc(kernel_size, causal)
    length, bsz = 7, 3
    r = torch.randn(length, bsz, D, dtype=torch.double)
    pad = torch.zeros(bsz, length, dtype=torch.bool)
    if causal:
        pad[1, -2:] = True  # target side: right padding
    else:
        pad[1, :3] = True  # source side: left padding
    out, _ = m(r, r, r, key_padding_mask=pad, need_weights=False,
               attn_mask=future_mask(length) if causal else None)
    assert out.shape == (length, bsz, D)
    torch.testing.assert_close(out, reference_dc(m, r, pad, causal), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kernel_size", [2, 3])
def test_output_of_stock_layer_is_eq_5_7(kernel_size):
    """Inside fairseq's own encoder layer, DC replaces the self-attention sublayer:
    z = LayerNorm(z_hat + r) (Eq. 5.7, the layer's residual and self_attn_layer_norm), then
    the layer's FFN sublayer LayerNorm(z + FFN(z)); z_hat from the equations (reference_dc)."""
    from model_utils import build, random_batch
    model, _ = build("multilayer_transformer", "--encoder-embed-dim", str(D), "--decoder-embed-dim", str(D),
                     "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
                     "--encoder-attention-heads", str(H), "--decoder-attention-heads", str(H),
                     "--encoder-layers", "2", "--decoder-layers", "1", "--dropout", "0",
                     "--encoder-self-attention", "dc", "--dc-kernel-size", str(kernel_size))
    layer = model.encoder.layers[0].double()
    assert isinstance(layer.self_attn, DualContextualAttention)
    r = torch.randn(6, 3, D, dtype=torch.double)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, :2] = True
    with torch.no_grad():
        out = layer(r, encoder_padding_mask=pad)
        z_hat = reference_dc(layer.self_attn, r, pad, False)
        z = F.layer_norm(z_hat + r, (D,), layer.self_attn_layer_norm.weight, layer.self_attn_layer_norm.bias)
        ffn = F.linear(F.relu(F.linear(z, layer.fc1.weight, layer.fc1.bias)), layer.fc2.weight, layer.fc2.bias)
        expected = F.layer_norm(z + ffn, (D,), layer.final_layer_norm.weight, layer.final_layer_norm.bias)
    keep = ~pad.t().unsqueeze(-1)  # padded positions are not compared
    torch.testing.assert_close(out.masked_select(keep), expected.masked_select(keep), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kernel_size", [2, 3])
def test_decoder_layer_with_dc_is_eq_5_7(kernel_size):
    """Inside fairseq's own decoder layer, causal DC replaces the masked self-attention
    sublayer: z = LayerNorm(z_hat + r) with z_hat from the equations (reference_dc, causal,
    right-padded targets), then fairseq's encoder-decoder attention and FFN sublayers."""
    from model_utils import build
    model, _ = build("multilayer_transformer", "--encoder-embed-dim", str(D), "--decoder-embed-dim", str(D),
                     "--encoder-ffn-embed-dim", "24", "--decoder-ffn-embed-dim", "24",
                     "--encoder-attention-heads", str(H), "--decoder-attention-heads", str(H),
                     "--encoder-layers", "1", "--decoder-layers", "2", "--dropout", "0",
                     "--decoder-self-attention", "dc", "--dc-kernel-size", str(kernel_size))
    layer = model.decoder.layers[1].double()
    assert isinstance(layer.self_attn, DualContextualAttention) and layer.self_attn.causal
    with torch.no_grad():
        for p in layer.parameters():  # random LayerNorms and biases too
            p.add_(0.3 * torch.randn_like(p))
    r = torch.randn(6, 3, D, dtype=torch.double)
    tgt_pad = torch.zeros(3, 6, dtype=torch.bool)
    tgt_pad[1, -2:] = True
    memory = torch.randn(5, 3, D, dtype=torch.double)
    src_pad = torch.zeros(3, 5, dtype=torch.bool)
    src_pad[2, :3] = True
    with torch.no_grad():
        out, _, _ = layer(r, memory, src_pad, self_attn_mask=future_mask(6), self_attn_padding_mask=tgt_pad)
        z_hat = reference_dc(layer.self_attn, r, tgt_pad, True)
        z = F.layer_norm(z_hat + r, (D,), layer.self_attn_layer_norm.weight, layer.self_attn_layer_norm.bias)
        cross, _ = layer.encoder_attn(query=z, key=memory, value=memory, key_padding_mask=src_pad)  # fairseq's own
        y = F.layer_norm(z + cross, (D,), layer.encoder_attn_layer_norm.weight, layer.encoder_attn_layer_norm.bias)
        ffn = F.linear(F.relu(F.linear(y, layer.fc1.weight, layer.fc1.bias)), layer.fc2.weight, layer.fc2.bias)
        expected = F.layer_norm(y + ffn, (D,), layer.final_layer_norm.weight, layer.final_layer_norm.bias)
    keep = ~tgt_pad.t().unsqueeze(-1)  # padded target positions are not compared
    torch.testing.assert_close(out.masked_select(keep), expected.masked_select(keep), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kernel_size", [2, 3])
def test_decoder_is_causal_in_full_and_incremental_mode(kernel_size):
    m = make_dc(kernel_size, causal=True)
    length, t0 = 8, 5
    x = torch.randn(length, 2, D, dtype=torch.double)
    y = x.clone()
    y[t0] = torch.randn(2, D, dtype=torch.double)  # change one future token
    y[t0 + 1 :] += 1.0
    for mask in (future_mask(length), None):  # the module masks causally even without attn_mask
        out_x, _ = m(x, x, x, attn_mask=mask)
        out_y, _ = m(y, y, y, attn_mask=mask)
        torch.testing.assert_close(out_x[:t0], out_y[:t0], atol=0, rtol=0)
        assert not torch.allclose(out_x[t0], out_y[t0])  # the change is visible where it may be
    # incremental: step by step, and the whole sequence as one cached chunk
    inc_x = torch.cat(run_incremental(m, x, None))
    inc_y = torch.cat(run_incremental(m, y, None))
    torch.testing.assert_close(inc_x[:t0], inc_y[:t0], atol=0, rtol=0)
    chunk_x, _ = m(x, x, x, incremental_state={})
    chunk_y, _ = m(y, y, y, incremental_state={})
    torch.testing.assert_close(chunk_x[:t0], chunk_y[:t0], atol=0, rtol=0)
    torch.testing.assert_close(chunk_x, inc_x, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kernel_size", [2, 3, 4])
@pytest.mark.parametrize("new_order", [[2, 0, 3, 1], [3, 1, 1]])  # permutation; beam shrink
def test_incremental_equals_full_with_reorder(kernel_size, new_order):
    m = make_dc(kernel_size, causal=True)
    length, bsz, reorder_at = 7, 4, 3
    x = torch.randn(length, bsz, D, dtype=torch.double)
    pad = torch.zeros(bsz, length, dtype=torch.bool)
    pad[1, -2:] = True
    pad[3, -1:] = True
    order = torch.tensor(new_order)
    full, _ = m(x, x, x, key_padding_mask=pad, attn_mask=future_mask(length))
    xo = x[:, order]
    full_reordered, _ = m(xo, xo, xo, key_padding_mask=pad[order], attn_mask=future_mask(length))
    for grad in (True, False):  # decoding (no grad) joins each step to the cache reordered, in one copy
        with torch.set_grad_enabled(grad):
            outs = run_incremental(m, x, pad, reorder_at=reorder_at, new_order=order)
        for t, out in enumerate(outs):
            expected = full[t : t + 1] if t < reorder_at else full_reordered[t : t + 1]
            torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kernel_size", [2, 3])
def test_left_padded_batch_equals_each_sentence_alone(kernel_size):
    m = make_dc(kernel_size, causal=False)
    lengths = [6, 3, 1]
    length = max(lengths)
    x = torch.randn(length, len(lengths), D, dtype=torch.double) * 3  # garbage at pads too
    pad = torch.zeros(len(lengths), length, dtype=torch.bool)
    for b, n in enumerate(lengths):
        pad[b, : length - n] = True
    out, _ = m(x, x, x, key_padding_mask=pad)
    for b, n in enumerate(lengths):
        alone = x[length - n :, b : b + 1]
        expected, _ = m(alone, alone, alone)
        torch.testing.assert_close(out[length - n :, b : b + 1], expected, atol=1e-10, rtol=1e-10)


def test_right_padded_decoder_batch_equals_each_sentence_alone():
    m = make_dc(3, causal=True)
    lengths = [5, 2]
    x = torch.randn(5, 2, D, dtype=torch.double)
    pad = torch.tensor([[False] * 5, [False] * 2 + [True] * 3])
    out, _ = m(x, x, x, key_padding_mask=pad, attn_mask=future_mask(5))
    for b, n in enumerate(lengths):
        alone = x[:n, b : b + 1]
        expected, _ = m(alone, alone, alone, attn_mask=future_mask(n))
        torch.testing.assert_close(out[:n, b : b + 1], expected, atol=1e-10, rtol=1e-10)


def test_parameter_delta_over_multihead_attention():
    d, f, layers = 512, 2, 6
    dc = DualContextualAttention(d, 8, kernel_size=f)
    mha = MultiheadAttention(d, 8, self_attention=True)

    # matrices and conv kernels, no biases / LayerNorm gains
    matrices = count_parameters(dc, matrices_only=True) - count_parameters(mha, matrices_only=True)
    assert matrices == (4 + 2 * f) * d * d
    assert layers * matrices == 12_582_912  # Enc-DC f = 2, thesis Table 5.2
    # biases: conv 2d + FI 2 x 3d + b_z d + LayerNorm 2d, against MultiheadAttention's 4d
    total = count_parameters(dc) - count_parameters(mha)
    assert total == (4 + 2 * f) * d * d + 7 * d


def test_attention_weights_and_interface():
    """The returned weights are the global FI unit's softmax (Eq. 5.5 with r as query and
    keys), per head or head-averaged as fairseq returns them."""
    m = make_dc(3, causal=True)
    assert (m.num_heads, m.head_dim) == (H, D // H)
    x = torch.randn(4, 2, D, dtype=torch.double)
    _, per_head = m(x, x, x, attn_mask=future_mask(4), need_head_weights=True)
    _, expected = reference_dc(m, x, None, True, with_weights=True)
    torch.testing.assert_close(per_head, expected, atol=1e-10, rtol=1e-10)  # H x B x T x S
    _, avg = m(x, x, x, attn_mask=future_mask(4), need_weights=True)
    torch.testing.assert_close(avg, per_head.mean(0))
    assert m(x, x, x, need_weights=False)[1] is None
    state = {}
    m(x[:1], x[:1], x[:1], incremental_state=state)
    assert m._get_input_buffer(state)["prev_conv_input"].shape == (2, D, 2)  # last f-1 inputs
    with pytest.raises(ValueError, match="self-attention"):
        m(x, torch.randn(3, 2, D, dtype=torch.double), None)
    with pytest.raises(ValueError, match="causal"):
        make_dc(3, causal=False)(x, x, x, incremental_state={})


def test_two_reorders_before_a_step_compose():
    """Beam search may reorder twice before the next step; the kept reorders apply in turn."""
    m = make_dc(2, causal=True)
    x = torch.randn(4, 4, D, dtype=torch.double)
    first, second = torch.tensor([3, 2, 1, 0]), torch.tensor([0, 0, 2])
    with torch.no_grad():
        state, once = {}, {}
        for t in range(3):
            m(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state)
            m(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=once)
        m.reorder_incremental_state(state, first)
        m.reorder_incremental_state(state, second)
        m.reorder_incremental_state(once, first[second])
        step, xo = x[3:4, first[second]], x[:, first[second]]
        out = m(step, step, step, incremental_state=state)[0]
        torch.testing.assert_close(out, m(step, step, step, incremental_state=once)[0], atol=0, rtol=0)
        torch.testing.assert_close(out, m(xo, xo, xo)[0][3:4], atol=1e-10, rtol=1e-10)  # the full forward
