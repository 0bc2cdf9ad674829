"""Each joint-attention module against its equation, in float64 with randomised weights
(thesis Sec. 3.2, Eq. 3.1-3.11; MLMHA paper; multi-source input combination paper Sec. 3):
the layer aggregations, MLMHA (U0, U1), flat, hierarchical (both forms) and parallel
combination; padding masked; a masked source layer equals the module built without it. The
references are in tests/joint_attention_reference.py."""
import re

import pytest
import torch

from fairseq_ext.modules.multi_layer_multihead_attention import MultiLayerMultiheadAttention
from fairseq_ext.modules.multi_source_attention import (
    FlatCrossAttention,
    HierarchicalCrossAttention,
    ParallelCrossAttention,
)
from joint_attention_reference import (
    AGGREGATION,
    MLMHA,
    build_aggregation,
    build_cross_attention,
    lin,
    perturb,
    random_sources,
    ref_aggregation,
    ref_flat,
    ref_hierarchical,
    ref_mha,
    ref_mlmha,
    ref_parallel,
)
from model_utils import count_parameters


# ----------------------------------------------------------------------------------------
# 1. each strategy's module against its equation
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", AGGREGATION)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_layer_aggregation_equations(strategy, n):
    torch.manual_seed(0)
    module = perturb(build_aggregation(strategy, n).double(), seed=1)
    sources, _, _ = random_sources(n)
    torch.testing.assert_close(module(sources), ref_aggregation(module, strategy, sources), atol=1e-10, rtol=0)
    # and not some other combination: every source matters
    for i in range(n):
        changed = list(sources)
        changed[i] = changed[i] + 1.0
        assert not torch.allclose(module(changed), module(sources))


@pytest.mark.parametrize("kind", ["s-agg", "c-agg"])
def test_iterative_aggregation_of_two_layers_is_the_linear_form(kind):
    """n = 2: Iter-X-Agg has one unit over [f^2, H_1 = f^1], the same unit as X-Agg over
    [f^1, f^2]; with its weights mapped to the swapped input order it is the same function."""
    linear = perturb(build_aggregation(kind, 2).double(), seed=1)
    iterative = build_aggregation("iter-" + kind, 2).double()
    assert count_parameters(iterative) == count_parameters(linear)
    state = linear.state_dict()
    if kind == "s-agg":
        state["units.0.weights.0.weight"], state["units.0.weights.1.weight"] = (
            state["units.0.weights.1.weight"], state["units.0.weights.0.weight"])
    else:
        w = state["units.0.fc1.weight"]
        state["units.0.fc1.weight"] = torch.cat([w[:, 16:], w[:, :16]], dim=1)
    iterative.load_state_dict(state)
    sources, _, _ = random_sources(2)
    torch.testing.assert_close(iterative(sources), linear(sources), atol=1e-12, rtol=0)
    # for n = 3 the iterative form is a different (bigger) model
    assert count_parameters(build_aggregation("iter-" + kind, 3)) > count_parameters(build_aggregation(kind, 3))


@pytest.mark.parametrize("strategy", MLMHA)
@pytest.mark.parametrize("n", [1, 3])
def test_mlmha_equations(strategy, n):
    u0, u1 = (int(c) for c in strategy[2:])
    torch.manual_seed(0)
    attn = MultiLayerMultiheadAttention(16, 4, n, layer_specific=bool(u0), sum_contexts=bool(u1)).double().eval()
    perturb(attn, seed=1, scale=0.5)
    sources, pad, query = random_sources(n)
    out, weights = attn(query, torch.stack(sources, dim=2), key_padding_mask=pad, need_head_weights=True)
    expected, joint = ref_mlmha(attn, query, sources, pad, u0, u1)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    assert attn.out_proj.in_features == (16 if u1 else n * 16)
    if u0 == 0:  # the returned weights are the joint weights, H x B x Z x J
        torch.testing.assert_close(weights, joint.transpose(0, 1), atol=1e-6, rtol=0)
    assert torch.all(weights.masked_select(pad[None, :, None, :].expand_as(weights)) == 0)


@pytest.mark.parametrize("n", [1, 3])
def test_flat_equations(n):
    torch.manual_seed(0)
    attn = perturb(build_cross_attention("flat", n).double().eval(), seed=1, scale=0.5)
    assert isinstance(attn, FlatCrossAttention)
    sources, pad, query = random_sources(n)
    out, weights = attn(query, torch.stack(sources, dim=2), key_padding_mask=pad, need_weights=True)
    expected, expected_weights = ref_flat(attn, query, sources, pad, with_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    # the returned weights (what alignments and the analyses read): B x Z x J, from the equations
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-6)


def test_flat_is_fairseqs_attention_over_the_sources_side_by_side():
    """flat is stock fairseq's attention over the n sources concatenated along the length axis,
    with flat's projections: in a full forward and step by step (docs/performance.md times flat's
    greedy decoding against stock fairseq doing this work)."""
    from fairseq.modules import MultiheadAttention

    n = 3
    attn = perturb(build_cross_attention("flat", n).double().eval(), seed=1, scale=0.5)
    stock = MultiheadAttention(16, 4, kdim=16, vdim=16, encoder_decoder_attention=True).double().eval()
    for mine, theirs in ((attn.q_proj, stock.q_proj), (attn.k_proj[0], stock.k_proj),
                         (attn.v_proj[0], stock.v_proj), (attn.out_proj, stock.out_proj)):
        theirs.load_state_dict(mine.state_dict())
    sources, pad, query = random_sources(n)
    stacked, side_by_side, side_by_side_pad = torch.stack(sources, dim=2), torch.cat(sources), torch.cat([pad] * n, 1)
    expected, _ = stock(query, side_by_side, side_by_side, key_padding_mask=side_by_side_pad, static_kv=True)
    torch.testing.assert_close(attn(query, stacked, key_padding_mask=pad)[0], expected, atol=1e-12, rtol=0)
    mine_state, stock_state = {}, {}
    for t in range(query.size(0)):
        step, _ = attn(query[t:t + 1], stacked, key_padding_mask=pad, incremental_state=mine_state)
        stock_step, _ = stock(query[t:t + 1], side_by_side, side_by_side, key_padding_mask=side_by_side_pad,
                              incremental_state=stock_state, static_kv=True)
        torch.testing.assert_close(step, stock_step, atol=1e-12, rtol=0)
        torch.testing.assert_close(step, expected[t:t + 1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_hierarchical_equations(n):
    torch.manual_seed(0)
    attn = perturb(HierarchicalCrossAttention(16, 4, n).double().eval(), seed=1, scale=0.5)
    sources, pad, query = random_sources(n)
    out, weights = attn(query, torch.stack(sources, dim=2), key_padding_mask=pad, need_weights=True)
    # fairseq's attention takes its softmax in float32, hence the relative tolerance
    expected, expected_weights = ref_hierarchical(attn, query, sources, pad, with_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)  # B x Z x J
    assert torch.all(weights.masked_select(pad[:, None, :].expand_as(weights)) == 0)
    if n == 1:  # one context with weight 1: the stock cross-attention, then W^O_2 W^V_2
        second = attn.context_attention
        expected = lin(lin(ref_mha(attn.source_attentions[0], query, sources[0], pad), second.v_proj),
                       second.out_proj)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


def test_parallel_equation():
    torch.manual_seed(0)
    attn = perturb(ParallelCrossAttention(16, 4, 3).double().eval(), seed=1, scale=0.5)
    sources, pad, query = random_sources(3)
    out, _ = attn(query, torch.stack(sources, dim=2), key_padding_mask=pad)
    torch.testing.assert_close(out, ref_parallel(attn, query, sources, pad), atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# 2. layer masking removes the layer: a masked f^i contributes nothing, as in
#     the same module built without that layer (the other layers' weights shared)
# ----------------------------------------------------------------------------------------
def _reduced_state(full_state, reduced_keys, keep, out_columns=None):
    """The parameters of the module without the removed source, taken from the full one:
    per-source entries (``k_proj.3.weight``, ``attentions.3....``) of the kept sources."""
    new = {}
    for key in reduced_keys:
        m = re.match(r"^(q_proj|k_proj|v_proj|attentions|source_attentions|layer_norms)\.(\d+)\.(.*)$", key)
        if m:
            new[key] = full_state[f"{m.group(1)}.{keep[int(m.group(2))]}.{m.group(3)}"]
        elif key == "out_proj.weight" and out_columns is not None:
            new[key] = full_state[key][:, out_columns]
        else:
            new[key] = full_state[key]
    return new


def _module(kind, num, removed_source=None):
    if kind == "parallel":
        return ParallelCrossAttention(16, 4, num, removed_source=removed_source)
    if kind == "flat":
        return FlatCrossAttention(16, 4, num, removed_source=removed_source)
    if kind == "hierarchical":
        return HierarchicalCrossAttention(16, 4, num, removed_source=removed_source)
    u0, u1 = (int(c) for c in kind[2:])
    return MultiLayerMultiheadAttention(16, 4, num, layer_specific=bool(u0), sum_contexts=bool(u1),
                                        removed_source=removed_source)


@pytest.mark.parametrize("removed", [0, 1, 2])
@pytest.mark.parametrize("kind", ["parallel", "flat", "hierarchical", "m-00", "m-01", "m-10", "m-11"])
def test_masked_layer_equals_the_module_without_it(kind, removed):
    torch.manual_seed(0)
    keep = [i for i in range(3) if i != removed]
    full = perturb(_module(kind, 3, removed).double().eval(), seed=1, scale=0.5)
    sources, pad, query = random_sources(3)
    out, _ = full(query, torch.stack(sources, dim=2), key_padding_mask=pad)
    reduced = _module(kind, 2).double().eval()
    state = full.state_dict()
    if kind == "flat":  # one set of projections for every source
        reduced.load_state_dict(state)
    else:  # U1 = 0: the removed context is a zero block of W_o's input
        columns = torch.cat([torch.arange(i * 16, (i + 1) * 16) for i in keep]) if kind in ("m-00", "m-10") else None
        reduced.load_state_dict(_reduced_state(state, reduced.state_dict(), keep, columns))
    expected, _ = reduced(query, torch.stack([sources[i] for i in keep], dim=2), key_padding_mask=pad)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    changed = list(sources)  # the masked layer's values do not matter at all
    changed[removed] = torch.randn_like(changed[removed])
    again, _ = full(query, torch.stack(changed, dim=2), key_padding_mask=pad)
    torch.testing.assert_close(again, out, atol=1e-9, rtol=0)


@pytest.mark.parametrize("removed", [0, 1, 2])
def test_masked_layer_of_serial_skips_its_sublayer(removed):
    """Serial over n = 4: masking one of the three lower layers equals the stack of the other
    two; masking f^n makes the layer's own cross-attention add nothing."""
    from fairseq_ext.modules.multi_source_attention import SerialCrossAttentionStack, SourceSelectAttention

    torch.manual_seed(0)
    full = perturb(SerialCrossAttentionStack(16, 4, 4, 0.0, 0.0, False, removed_source=removed).double().eval(),
                   seed=1, scale=0.5)
    keep = [i for i in range(3) if i != removed]
    reduced = SerialCrossAttentionStack(16, 4, 3, 0.0, 0.0, False).double().eval()
    reduced.load_state_dict(_reduced_state(full.state_dict(), reduced.state_dict(), keep))
    sources, pad, query = random_sources(4)
    memory = torch.stack(sources, dim=2)
    expected = reduced(query, torch.stack([sources[i] for i in keep] + [sources[3]], dim=2), pad)
    torch.testing.assert_close(full(query, memory, pad), expected, atol=1e-6, rtol=1e-6)
    top = SourceSelectAttention(16, 4, encoder_decoder_attention=True, source_index=3, removed=True).double()
    out, _ = top(query, memory, memory, key_padding_mask=pad)
    assert torch.count_nonzero(out) == 0


# ----------------------------------------------------------------------------------------
# 3. the rows of a sentence's beam, grouped to share its static keys and values
# ----------------------------------------------------------------------------------------
def test_identical_row_groups_divides_every_run_of_equal_rows():
    from fairseq_ext.modules.attention_utils import group_queries, identical_row_groups, ungroup

    a, b, c = (torch.full((5, 1, 2, 3), float(v)) for v in (1, 2, 3))
    assert identical_row_groups(torch.cat([a, a, b, b, c, c], dim=1)) == 2
    assert identical_row_groups(torch.cat([a, a, a, a, c, c], dim=1)) == 2  # equal neighbours merge runs
    assert identical_row_groups(torch.cat([a, a, b, c, c, c], dim=1)) == 1
    assert identical_row_groups(torch.cat([a, b, b, c, c], dim=1)) == 1  # a first run of one row (greedy)
    assert identical_row_groups(torch.cat([a, a, a], dim=1)) == 3
    nan = torch.full((5, 1, 2, 3), float("nan"))
    assert identical_row_groups(torch.cat([nan, nan], dim=1)) == 1  # never claims NaN rows equal
    q = torch.randn(6, 4, 1, 8)  # N x H x Z x D, sentence-major blocks of 3
    grouped = group_queries(q, 2)
    assert grouped.shape == (2, 4, 3, 8) and torch.equal(grouped[1, :, 2], q[5, :, 0])
    assert torch.equal(ungroup(grouped, 6), q)


def test_hierarchical_trains_its_n_attentions_together():
    """In training the n first-level attentions run as one batched computation (and the second
    level as n-long sums): the output and every gradient are those of the n fairseq attentions
    run one by one (the path of a full forward in evaluation)."""
    torch.manual_seed(0)
    attn = perturb(HierarchicalCrossAttention(16, 4, 3).double(), seed=1, scale=0.5)
    sources, pad, query = random_sources(3)
    memory = torch.stack(sources, dim=2)
    results = []
    for training in (False, True):
        attn.train(training)
        attn.zero_grad()
        out, _ = attn(query, memory, key_padding_mask=pad)
        out.pow(2).sum().backward()
        results.append((out.detach(), {k: p.grad.clone() for k, p in attn.named_parameters()}))
    (one_by_one, grads), (together, batched_grads) = results  # fairseq's softmax is fp32: 1e-5
    torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=1e-5)
    scale = max(float(g.abs().max()) for g in grads.values())  # fp32 softmax noise, against the largest
    for name, grad in grads.items():
        torch.testing.assert_close(batched_grads[name], grad, atol=1e-5 * scale, rtol=1e-5, msg=name)
