"""Mixed Multi-Head Self-Attention (Cui et al., 2019, Eq. 7-11): per-head masks, equality with
fairseq's MultiheadAttention when all heads are global, NaN-free padding, head-spec errors,
incremental decoding and the zero parameter delta."""
import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from fairseq_ext.modules.mixed_multihead_attention import MixedMultiheadAttention, parse_mma_heads
from model_utils import count_parameters

D = 16


def make_mma(spec, num_heads=4, window=1, causal=False, seed=0):
    torch.manual_seed(seed)
    m = MixedMultiheadAttention(D, num_heads, head_spec=spec, window=window, causal=causal,
                                self_attention=True)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.4)
    return m.eval()


def allowed(head, i, j, w, causal=False):
    """Eq. 8-11 for one query i and key j; in decoder self-attention (causal) a key j > i is
    never allowed, so a local head keeps the past side of its window."""
    if causal and j > i:
        return False
    return {"G": True, "L": abs(i - j) <= w, "F": j >= i, "B": j <= i}[head]


def future_mask(length):
    return torch.triu(torch.full((length, length), float("-inf")), 1)


@pytest.mark.parametrize("window", [1, 2])
def test_each_head_is_zero_outside_its_mask(window):
    heads = ["G", "L", "F", "B"]
    m = make_mma(",".join(heads), window=window)
    length = 7
    x = torch.randn(length, 2, D)
    _, w = m(x, x, x, need_head_weights=True)
    assert w.shape == (4, 2, length, length)
    for h, head in enumerate(heads):
        for i in range(length):
            for j in range(length):
                if allowed(head, i, j, window):
                    assert torch.all(w[h, :, i, j] > 0), (head, i, j)
                else:
                    assert torch.all(w[h, :, i, j] == 0), (head, i, j)
    torch.testing.assert_close(w.sum(-1), torch.ones(4, 2, length))
    _, avg = m(x, x, x, need_weights=True)
    torch.testing.assert_close(avg, w.mean(0))


def test_one_module_masks_every_length_it_meets():
    """A module's masks are views of one table it keeps (made again for a longer sequence): each
    length, met in any order and beyond the first table's 64 positions, gets Eq. 8-11's masks."""
    m = make_mma("G,L,F,B", window=2)
    for length in (5, 70, 3, 130):
        x = torch.randn(length, 1, D)
        _, w = m(x, x, x, need_head_weights=True)
        expected = torch.tensor([[[allowed(head, i, j, 2) for j in range(length)] for i in range(length)]
                                 for head in m.head_types])
        assert torch.equal(w[:, 0] > 0, expected), length
    assert m.blocked_pairs(1, 130, x.device).shape == (4, 1, 130)  # a decoding step's query: the last row


def test_default_split_masks_pairs_of_heads():
    m = make_mma(None, num_heads=8)
    assert m.head_types == ["G", "G", "L", "L", "F", "F", "B", "B"]
    x = torch.randn(5, 1, D)
    _, w = m(x, x, x, need_head_weights=True)
    assert torch.all(w[2:4].triu(2) == 0) and torch.all(w[2:4].tril(-2) == 0)  # local, w = 1
    assert torch.all(w[4:6].tril(-1) == 0) and torch.all(w[6:8].triu(1) == 0)  # forward, backward
    assert torch.all(w[0:2] > 0)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")  # inside fairseq's MHA
@pytest.mark.parametrize("with_future_mask", [False, True])
def test_all_global_equals_fairseq_multihead_attention(with_future_mask):
    torch.manual_seed(1)
    mha = MultiheadAttention(D, 4, self_attention=True).eval()
    mma = MixedMultiheadAttention(D, 4, head_spec="G", self_attention=True).eval()
    mma.load_state_dict(mha.state_dict())
    length = 6
    x = torch.randn(length, 3, D)
    pad = torch.zeros(3, length, dtype=torch.bool)
    pad[1, :2] = True  # left padding
    mask = future_mask(length) if with_future_mask else None
    if with_future_mask:
        pad = pad.flip(1)  # decoder: right padding
    out_ref, w_ref = mha(x, x, x, key_padding_mask=pad, attn_mask=mask, need_weights=True)
    out, w = mma(x, x, x, key_padding_mask=pad, attn_mask=mask, need_weights=True)
    assert (out - out_ref).abs().max() < 1e-6
    assert (w - w_ref).abs().max() < 1e-6


@pytest.mark.parametrize("spec,window,causal", [("G,L,F,B", 1, False), ("L,F,B,G", 2, False), ("G,G,L,B", 3, False),
                                                ("L,B,L,B", 1, True), ("L,L,B,B", 2, True)])
@pytest.mark.parametrize("padded", [True, False])  # fairseq passes no padding mask to a batch without padding
def test_output_is_the_masked_attention_equation(spec, window, causal, padded):
    """Eq. 7-11 recomputed in plain torch from the module's own projections: per head h,
    softmax(q_h k_h^T / sqrt(d_k) + M_h) v_h with M_h = 0 where the head may look and -inf
    elsewhere, the heads concatenated and projected. Padding keys masked in every head; the
    decoder (causal) with fairseq's future mask, its local heads seeing i - w .. i."""
    heads = spec.split(",")
    m = make_mma(spec, window=window, causal=causal)
    length, bsz, dk = 6, 2, D // 4
    x = torch.randn(length, bsz, D)
    pad = torch.zeros(bsz, length, dtype=torch.bool)
    if causal:
        pad[1, -1:] = True  # target side: the second sentence is right-padded by one
    else:
        pad[1, :1] = True  # source side: left-padded by one
    pad &= padded
    out, w = m(x, x, x, key_padding_mask=pad if padded else None, need_head_weights=True,
               attn_mask=future_mask(length) if causal else None)
    q = m.q_proj(x).view(length, bsz, 4, dk).permute(1, 2, 0, 3)  # B x H x T x dk
    k = m.k_proj(x).view(length, bsz, 4, dk).permute(1, 2, 0, 3)
    v = m.v_proj(x).view(length, bsz, 4, dk).permute(1, 2, 0, 3)
    mask = torch.tensor([[[0.0 if allowed(head, i, j, window, causal) else float("-inf") for j in range(length)]
                          for i in range(length)] for head in heads])  # H x T x T
    scores = q @ k.transpose(-1, -2) / dk ** 0.5 + mask
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    expected = m.out_proj((probs @ v).permute(2, 0, 1, 3).reshape(length, bsz, D))
    rows = [(0, range(length)), (1, range(length - padded) if causal else range(padded, length))]  # not a pad
    for b, keep in rows:
        torch.testing.assert_close(out[list(keep), b], expected[list(keep), b], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(w[:, b, list(keep)], probs[b][:, list(keep)], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "spec,pad_side", [("F,F,B,B", "left"), ("F,F,B,B", "right"), ("B", "left"), ("F", "right"), ("L,L,F,B", "left")]
)
def test_padded_rows_never_nan(spec, pad_side):
    m = make_mma(spec)
    m.train()  # gradients too
    length = 6
    x = torch.randn(length, 3, D, requires_grad=True)
    pad = torch.zeros(3, length, dtype=torch.bool)
    pad[1, :3] = True
    pad[2, :1] = True
    if pad_side == "right":
        pad = pad.flip(1)
    out, w = m(x, x, x, key_padding_mask=pad, need_head_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())
    # rows with nothing allowed get zero weights; the others are distributions over real tokens
    assert torch.all(w[:, pad[:, None, :].expand(-1, length, -1)] == 0)
    row_sums = w.sum(-1)  # H x B x T
    assert torch.all((row_sums - 1).abs().lt(1e-5) | row_sums.eq(0))
    heads = m.head_types
    for h, head in enumerate(heads):
        for b in range(3):
            for i in range(length):
                has_any = any(allowed(head, i, j, 1) and not pad[b, j] for j in range(length))
                assert (row_sums[h, b, i] > 0.5) == has_any, (head, b, i)
    if "B" in spec and pad_side == "left":
        assert torch.any(row_sums == 0)  # the case this test is about did occur


def test_parse_mma_heads_expansion():
    assert parse_mma_heads(None, 8, causal=False) == list("GGLLFFBB")
    assert parse_mma_heads("", 4, causal=False) == list("GLFB")
    assert parse_mma_heads("G,L,F,B", 8, causal=False) == list("GGLLFFBB")
    assert parse_mma_heads("G,L,L,L", 8, causal=False) == list("GGLLLLLL")
    assert parse_mma_heads("l, b", 4, causal=True) == list("LLBB")
    assert parse_mma_heads("G,L,F,B,B,F,L,G", 8, causal=False) == list("GLFBBFLG")


@pytest.mark.parametrize(
    "spec,num_heads,causal",
    [
        ("G,L,F", 8, False),  # length does not divide the heads
        ("G,L,F,B,G,L,F,B,G", 8, False),  # more letters than heads
        ("G,X,F,B", 8, False),  # unknown letter
        ("G,,F,B", 8, False),  # empty entry
        (None, 6, False),  # default split needs num_heads % 4 == 0
        ("L,F", 4, True),  # forward head in the decoder
        ("G,B", 4, True),  # global head in the decoder
        ("L,B,L", 4, True),  # length does not divide the heads
    ],
)
def test_bad_head_specs_name_the_flag(spec, num_heads, causal):
    flag = "^--decoder-mma-heads" if causal else "^--mma-heads"
    with pytest.raises(ValueError, match=flag):
        parse_mma_heads(spec, num_heads, causal)
    with pytest.raises(ValueError, match=flag):
        MixedMultiheadAttention(D * 3, num_heads, head_spec=spec, causal=causal, self_attention=True)


def test_decoder_default_is_local_and_backward():
    assert parse_mma_heads(None, 8, causal=True) == list("LLLLBBBB")
    assert parse_mma_heads("", 4, causal=True) == list("LLBB")


def test_causal_error_explains():
    with pytest.raises(ValueError, match="causal"):
        parse_mma_heads("L,F", 4, causal=True)


@pytest.mark.parametrize("spec,window", [("L,B,L,B", 1), ("L,B,L,B", 2), ("L", 1)])
@pytest.mark.parametrize("new_order", [[2, 0, 3, 1], [3, 3, 0]])
def test_decoder_incremental_equals_full(spec, window, new_order):
    m = make_mma(spec, window=window, causal=True)
    length, bsz, reorder_at = 7, 4, 4
    x = torch.randn(length, bsz, D)
    pad = torch.zeros(bsz, length, dtype=torch.bool)
    pad[1, -2:] = True  # target side: right padding
    order = torch.tensor(new_order)
    full, _ = m(x, x, x, key_padding_mask=pad, attn_mask=future_mask(length))
    no_mask, _ = m(x, x, x, key_padding_mask=pad)  # causal by itself
    torch.testing.assert_close(no_mask, full)
    xo = x[:, order]
    full_reordered, _ = m(xo, xo, xo, key_padding_mask=pad[order], attn_mask=future_mask(length))

    state, cur_x, cur_pad = {}, x, pad
    for t in range(length):
        if t == reorder_at:
            m.reorder_incremental_state(state, order)
            cur_x, cur_pad = xo, pad[order]
        step = cur_x[t : t + 1]
        out, _ = m(step, step, step, key_padding_mask=cur_pad[:, t : t + 1], incremental_state=state,
                   need_weights=False, attn_mask=None)
        expected = full[t : t + 1] if t < reorder_at else full_reordered[t : t + 1]
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    assert m._get_input_buffer(state)["prev_key"].shape == (len(new_order), 4, length, D // 4)


def test_decoder_local_head_sees_only_its_past_window():
    m = make_mma("L", window=2, causal=True)
    x = torch.randn(6, 1, D)
    _, w = m(x, x, x, need_head_weights=True)
    for i in range(6):
        for j in range(6):
            assert bool(w[0, 0, i, j] > 0) == (i - 2 <= j <= i), (i, j)


def test_zero_extra_parameters_and_same_state_dict():
    mha = MultiheadAttention(512, 8, self_attention=True)
    mma = MixedMultiheadAttention(512, 8, self_attention=True)
    assert count_parameters(mma) == count_parameters(mha)
    assert {k: v.shape for k, v in mma.state_dict().items()} == {k: v.shape for k, v in mha.state_dict().items()}
    assert isinstance(mma, MultiheadAttention)
