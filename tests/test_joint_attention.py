"""Joint attention strategies over the encoder layers (thesis 3.2, Eq. 3.1-3.11; MLMHA
paper; multi-source input combination paper Sec. 3; SPEC sections 1-4 and 9).

The references below are written out in plain torch from the equations, independently of
``fairseq_ext.modules.attention_utils``; they only read the modules' parameters.
"""
import math
import re

import pytest
import torch
import torch.nn.functional as F

from fairseq_ext.models import joint_attention_strategies as table
from fairseq_ext.models.joint_attention_strategies import CrossAttentionSpec, Memory, MemorySpec
from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel
from fairseq_ext.models.multilayer_transformer_config import parse_options
from fairseq_ext.modules.multi_layer_multihead_attention import MultiLayerMultiheadAttention
from fairseq_ext.modules.multi_source_attention import (
    FlatOrHierarchicalCrossAttention,
    HierarchicalCrossAttention,
    ParallelCrossAttention,
)
from fairseq_ext.modules.stacked_source_attention import StackedSourceAttention
from model_utils import (
    MULTI30K_TRAIN_FLAGS,
    SMALL,
    beam_search_rescored,
    build,
    build_stock,
    full_and_incremental,
    make_dictionary,
    parse_model_args,
    random_batch,
    train_recording_validation,
)

L_SMALL = 3  # SMALL: 3 encoder layers, 2 decoder layers, d 32, 4 heads


def _rows(memory=None):
    return tuple(name for name, s in table.STRATEGIES.items() if memory is None or s.memory is memory)


def build_cross_attention(strategy, num_sources=2):
    """The cross-attention module the table builds for ``strategy`` (16 dims, 4 heads)."""
    spec = CrossAttentionSpec(embed_dim=16, num_heads=4, num_sources=num_sources, dropout=0.0, layer_number=1,
                              kdim=16)
    return table.STRATEGIES[strategy].build_cross_attention(spec)


def build_aggregation(strategy, num_sources):
    """The layer aggregation the table builds for ``strategy`` (16 dims, FFN 24)."""
    spec = MemorySpec(embed_dim=16, ffn_dim=24, num_sources=num_sources, activation_dropout=0.0,
                      num_encoder_layers=L_SMALL, num_decoder_layers=2)
    return table.STRATEGIES[strategy].build_memory(spec)


# Every row of the table gets the model-level tests (the equations, one collected layer as
# the stock Transformer, incremental decoding, reorders, beam search, padding, training):
# adding a row to the table adds its tests.
ALL_OPTIONS = _rows()
STRATEGIES = tuple(name for name in ALL_OPTIONS if table.STRATEGIES[name].memory is not Memory.NONE)
AGGREGATION = _rows(Memory.AGGREGATED)
STACKED = _rows(Memory.STACKED)
# the attentions over stacked sources that cache one row of static keys/values per sentence
SHARES_STATIC_ROWS = tuple(name for name in STACKED if isinstance(build_cross_attention(name), StackedSourceAttention))
# stacked rows that are not the stock cross-attention with n = 1 (hierarchical adds a second
# attention level: test_hierarchical_equations)
NOT_STOCK_WITH_ONE_LAYER = ("hierarchical",)
# the equations' families, tested module by module against the papers
MLMHA = ("m-00", "m-01", "m-10", "m-11")
MULTI_SOURCE = ("serial", "parallel", "flat", "hierarchical", "hierarchical-shared")


def count(model):
    return sum(p.numel() for p in model.parameters())


def perturb(module, seed=0, scale=0.2):
    """Random everything (biases and LayerNorms included), so that no term of an equation
    can hide behind a zero or one initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def small_model(strategy, *flags, n=None, seed=0, dictionary=None):
    dictionary = dictionary or make_dictionary()
    extra = () if strategy == "none" else ("--joint-attention", strategy)
    if n is not None:
        extra += ("--joint-attention-layers", str(n))
    model, args = build("multilayer_transformer", *SMALL, *extra, *flags, dictionary=dictionary, seed=seed)
    return perturb(model.double(), seed=seed + 1), args, dictionary


# ----------------------------------------------------------------------------------------
# plain-torch references
# ----------------------------------------------------------------------------------------
def lin(x, m):
    return F.linear(x, m.weight, m.bias)


def ln(x, m):
    return F.layer_norm(x, (x.size(-1),), m.weight, m.bias, m.eps)


def heads(x, num_heads):
    """T x B x C -> B x H x T x (C / H), head h = channels h*dk .. (h+1)*dk - 1."""
    length, bsz, dim = x.shape
    return x.reshape(length, bsz, num_heads, dim // num_heads).permute(1, 2, 0, 3)


def unheads(x):
    """B x H x T x D -> T x B x (H D)."""
    return torch.cat(x.unbind(1), dim=-1).transpose(0, 1)


def logits_of(q, k, pad=None, causal=False):
    """q B x H x Z x D, k B x H x J x D -> B x H x Z x J, masked positions at -inf."""
    a = torch.einsum("bhzd,bhjd->bhzj", q, k) / math.sqrt(q.size(-1))
    if pad is not None:
        a = a.masked_fill(pad[:, None, None, :], float("-inf"))
    if causal:
        a = a.masked_fill(torch.ones(a.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return a


def ref_mha(attn, query, source, pad=None, causal=False):
    """Standard multi-head attention with fairseq MultiheadAttention's parameters."""
    h = attn.num_heads
    q, k, v = heads(lin(query, attn.q_proj), h), heads(lin(source, attn.k_proj), h), heads(lin(source, attn.v_proj), h)
    w = logits_of(q, k, pad, causal).softmax(-1)
    return lin(unheads(w @ v), attn.out_proj)


def ref_mlmha(attn, query, sources, pad, u0, u1):
    """Eq. 3.7-3.11: per-source projections; U0 = 0 one softmax over sum_i a^i, U0 = 1 a
    softmax per source; U1 = 0 concatenation of the c^i, U1 = 1 their sum; then W_o.
    Returns the output Z x B x C and the attention weights (B x H x Z x J, U0 = 0)."""
    h = attn.num_heads
    qs = [heads(lin(query, attn.q_proj[i]), h) for i in range(len(sources))]
    ks = [heads(lin(f, attn.k_proj[i]), h) for i, f in enumerate(sources)]
    vs = [heads(lin(f, attn.v_proj[i]), h) for i, f in enumerate(sources)]
    a = [logits_of(q, k, pad) for q, k in zip(qs, ks)]
    if u0 == 0:
        joint = sum(a).softmax(-1)
        contexts = [unheads(joint @ v) for v in vs]
    else:
        joint = None
        contexts = [unheads(ai.softmax(-1) @ v) for ai, v in zip(a, vs)]
    combined = sum(contexts) if u1 == 1 else torch.cat(contexts, dim=-1)
    return lin(combined, attn.out_proj), joint


def ref_flat(attn, query, sources, pad, with_weights=False):
    """Eq. 5-6: K_flat = V_flat = concat_i(f^i) along the length axis, one attention (one
    set of projections) over all n J positions, one softmax. The weights (with_weights):
    that softmax's mass on source position j summed over the n sources, head-averaged
    (B x Z x J)."""
    assert len(attn.k_proj) == len(attn.v_proj) == 1
    states = torch.cat(sources, dim=0)  # nJ x B x C
    mask = None if pad is None else torch.cat([pad] * len(sources), dim=1)
    h = attn.num_heads
    q = heads(lin(query, attn.q_proj), h)
    k, v = heads(lin(states, attn.k_proj[0]), h), heads(lin(states, attn.v_proj[0]), h)
    w = logits_of(q, k, mask).softmax(-1)  # B x H x Z x nJ
    out = lin(unheads(w @ v), attn.out_proj)
    if not with_weights:
        return out
    length = sources[0].size(0)
    return out, sum(w[..., i * length : (i + 1) * length] for i in range(len(sources))).mean(1)


def ref_mha_weights(attn, query, source, pad=None):
    """The softmax weights of ref_mha, B x H x Z x J."""
    h = attn.num_heads
    return logits_of(heads(lin(query, attn.q_proj), h), heads(lin(source, attn.k_proj), h), pad).softmax(-1)


def ref_hierarchical(attn, query, sources, pad, with_weights=False):
    """Eq. 7-8 with A^h of Eq. 2-3: c_i = A^h_i(Q, f^i) with the i-th attention's own
    W^Q, W^K, W^V, W^O; then, at every target position z separately, one more A^h (own
    projections) with the query x_z and keys = values = [c_1[z], ..., c_n[z]]. The weights
    (with_weights): sum_i beta_i alpha_i, alpha_i source i's head-averaged weights and
    beta_i the second level's head-averaged weight of c_i (B x Z x J)."""
    contexts = [ref_mha(a, query, f, pad) for a, f in zip(attn.source_attentions, sources)]  # Z x B x C
    outputs, betas = [], []
    for z in range(query.size(0)):
        states = torch.stack([c[z] for c in contexts])  # n x B x C: the n contexts of position z
        outputs.append(ref_mha(attn.context_attention, query[z : z + 1], states))
        betas.append(ref_mha_weights(attn.context_attention, query[z : z + 1], states).mean(1)[:, 0])  # B x n
    out = torch.cat(outputs, dim=0)
    if not with_weights:
        return out
    beta = torch.stack(betas, dim=1)  # B x Z x n
    alphas = [ref_mha_weights(a, query, f, pad).mean(1) for a, f in zip(attn.source_attentions, sources)]
    return out, sum(beta[..., i, None] * alpha for i, alpha in enumerate(alphas))


def ref_hierarchical_shared(attn, query, sources, pad, with_weights=False):
    """The first release's simplified form (strategy hierarchical-shared): per head,
    c_i = softmax(q k_i^T / sqrt(dk)) v_i with one shared query projection, then
    beta = softmax_i(q . c_i / sqrt(dk)), context = sum_i beta_i c_i; then one W_o. The
    weights (with_weights): sum_i beta_i alpha_i per head, then head-averaged (B x Z x J)."""
    h = attn.num_heads
    q = heads(lin(query, attn.q_proj), h)  # B x H x Z x D
    cs, alphas = [], []
    for i, f in enumerate(sources):
        k, v = heads(lin(f, attn.k_proj[i]), h), heads(lin(f, attn.v_proj[i]), h)
        alphas.append(logits_of(q, k, pad).softmax(-1))
        cs.append(alphas[-1] @ v)
    scores = torch.stack([(q * c).sum(-1) for c in cs], dim=-1) / math.sqrt(q.size(-1))  # B x H x Z x n
    beta = scores.softmax(-1)
    context = sum(beta[..., i, None] * c for i, c in enumerate(cs))
    out = lin(unheads(context), attn.out_proj)
    if not with_weights:
        return out
    return out, sum(beta[..., i, None] * alpha for i, alpha in enumerate(alphas)).mean(1)


def ref_parallel(attn, query, sources, pad):
    """Eq. 4: sum_i Att_i(Q, f^i), n independent attentions."""
    return sum(ref_mha(a, query, f, pad) for a, f in zip(attn.attentions, sources))


def ref_ws(unit, inputs):
    """WS(r_1..r_b) = sum_i W_i r_i (Eq. 3.1)."""
    return sum(r @ w.weight.t() for w, r in zip(unit.weights, inputs))


def ref_agg(unit, inputs):
    """AGG(r_1..r_b) = LayerNorm(FFN(concat(r)) + sum_i r_i) (Eq. 3.3)."""
    hidden = lin(torch.relu(lin(torch.cat(inputs, dim=-1), unit.fc1)), unit.fc2)
    return ln(hidden + sum(inputs), unit.layer_norm)


def ref_aggregation(module, strategy, features):
    """Eq. 3.1-3.5: S-Agg / C-Agg one unit over f^1..f^n; the iterative forms
    H_1 = f^1, H_i = unit([f^i, H_{i-1}]), H^a = H_n."""
    unit_fn = ref_ws if strategy.endswith("s-agg") else ref_agg
    if not strategy.startswith("iter-"):
        assert len(module.units) == 1
        return unit_fn(module.units[0], features)
    assert len(module.units) == len(features) - 1
    state = features[0]
    for unit, f in zip(module.units, features[1:]):
        state = unit_fn(unit, [f, state])
    return state


def ref_transparent(weight, states):
    """Bapna et al.: memory of decoder layer j = sum_{i=0..L} softmax(w_{:,j})_i H^i_e."""
    mix = weight.softmax(dim=0)  # (L+1) x M
    return [sum(mix[i, j] * s for i, s in enumerate(states)) for j in range(weight.size(1))]


def ref_memories(model, encoder_out, strategy, n):
    """What every decoder layer reads, from the encoder's layer outputs: one tensor
    (J x B x C) or the list f^1..f^n, per decoder layer."""
    states = list(encoder_out["encoder_states"])  # H^0 (embeddings), H^1 .. H^L
    num_layers = len(model.decoder.layers)
    features = states[len(states) - n:]  # f^1 .. f^n, bottom to top; f^n = H^L
    if strategy == "none":
        return [states[-1]] * num_layers
    if strategy in AGGREGATION:
        return [ref_aggregation(model.encoder.layer_aggregation, strategy, features)] * num_layers
    if strategy == "transparent":
        return ref_transparent(model.encoder.transparent.weight, states)
    return [features] * num_layers


def ref_cross_sublayer(layer, strategy, x, memory, pad):
    """x <- the layer's cross-attention part (residual and post-norm included)."""
    attn, norm = layer.encoder_attn, layer.encoder_attn_layer_norm
    if strategy in ("none", "transparent") + AGGREGATION:
        return ln(x + ref_mha(attn, x, memory, pad), norm)
    if strategy in MLMHA:
        u0, u1 = (int(c) for c in strategy[2:])
        return ln(x + ref_mlmha(attn, x, memory, pad, u0, u1)[0], norm)
    if strategy == "serial":  # x = LN_i(x + Att_i(x, f^i)), i = 1..n, one after another
        stack = layer.serial_stack
        sublayers = [] if stack is None else list(zip(stack.attentions, stack.layer_norms))
        sublayers.append((attn, norm))
        assert len(sublayers) == len(memory)
        for (a, norm_i), f in zip(sublayers, memory):
            x = ln(x + ref_mha(a, x, f, pad), norm_i)
        return x
    combine = {"parallel": ref_parallel, "flat": ref_flat, "hierarchical": ref_hierarchical,
               "hierarchical-shared": ref_hierarchical_shared}[strategy]
    return ln(x + combine(attn, x, memory, pad), norm)


def ref_decoder_layer(layer, strategy, x, memory, pad):
    """Eq. 3.6 (post-norm): S = LN(MHA(x) + x); cross-attention sublayer(s); LN(FFN + .)."""
    x = ln(x + ref_mha(layer.self_attn, x, x, causal=True), layer.self_attn_layer_norm)
    x = ref_cross_sublayer(layer, strategy, x, memory, pad)
    return ln(x + lin(torch.relu(lin(x, layer.fc1)), layer.fc2), layer.final_layer_norm)


def ref_decoder_features(model, strategy, n, encoder_out, prev):
    decoder = model.decoder
    x = decoder.embed_scale * decoder.embed_tokens(prev) + decoder.embed_positions(prev)
    x = x.transpose(0, 1)
    pad = encoder_out["encoder_padding_mask"][0]
    for layer, memory in zip(decoder.layers, ref_memories(model, encoder_out, strategy, n)):
        x = ref_decoder_layer(layer, strategy, x, memory, pad)
    return x.transpose(0, 1)


# ----------------------------------------------------------------------------------------
# 1. parameter counts (SPEC section 9, thesis Tables 3.2 and 3.4)
# ----------------------------------------------------------------------------------------
D, D_FF, N_LAYERS = 512, 2048, 6
# thesis baseline 61.2M (WMT'14 En-De, shared embeddings): 44,138,496 non-embedding
# parameters + V x 512; V = 33,320 (a multiple of 8, as fairseq pads dictionaries) gives
# 61,198,336
VOCAB_61_2M = 33320


@pytest.fixture(scope="module")
def base_counts():
    """Parameter counts of the base config, built on the meta device (no memory, no init)."""
    cache = {}
    dictionaries = {}

    def counts(strategy="none", n=None, vocab=40, stock=False):
        key = (strategy, n, vocab, stock)
        if key not in cache:
            if vocab not in dictionaries:
                dictionaries[vocab] = make_dictionary(vocab - 4)  # + 4 special symbols
            flags = ("--share-all-embeddings",)
            if strategy != "none":
                flags += ("--joint-attention", strategy)
            if n is not None:
                flags += ("--joint-attention-layers", str(n))
            with torch.device("meta"):
                if stock:
                    model, _ = build_stock("transformer_wmt_en_de", *flags, dictionary=dictionaries[vocab])
                else:
                    model, _ = build("multilayer_transformer_wmt_en_de", *flags, dictionary=dictionaries[vocab])
            assert len(dictionaries[vocab]) == vocab
            cache[key] = count(model)
        return cache[key]

    return counts


def spec_delta(strategy, n=N_LAYERS, d=D, d_ff=D_FF, m=N_LAYERS):
    """SPEC section 9: deltas over the baseline, ignoring biases and LayerNorms."""
    return {
        "s-agg": n * d * d,
        "iter-s-agg": 2 * (n - 1) * d * d,
        "c-agg": n * d * d_ff + d_ff * d,
        "iter-c-agg": (n - 1) * (2 * d * d_ff + d_ff * d),
        "m-01": m * 3 * (n - 1) * d * d,
        "m-11": m * 3 * (n - 1) * d * d,
        "m-00": m * 4 * (n - 1) * d * d,
        "m-10": m * 4 * (n - 1) * d * d,
    }[strategy]


def exact_multi_source_delta(strategy, n=N_LAYERS, d=D, m=N_LAYERS):
    """From the definitions (SPEC section 4, multi-source paper Sec. 3), biases included;
    a fairseq attention has 4 (d^2 + d) parameters, a LayerNorm 2d."""
    attention = 4 * (d * d + d)
    return m * {
        "serial": (n - 1) * (attention + 2 * d),  # n - 1 more sublayers, each with its LayerNorm
        "parallel": (n - 1) * attention,  # n independent attentions
        "flat": 0,  # one attention over the concatenated states
        "hierarchical": n * attention,  # n first-level attentions and the second level, minus the stock one
        "hierarchical-shared": (n - 1) * 2 * (d * d + d),  # per-source W^k, W^v; one W^q, W^o
    }[strategy]


def test_stock_transformer_base_has_the_same_count_as_ours_without_option(base_counts):
    assert base_counts() == base_counts(stock=True)
    assert base_counts(vocab=VOCAB_61_2M) == base_counts(vocab=VOCAB_61_2M, stock=True) == 61_198_336


@pytest.mark.parametrize("strategy", AGGREGATION + MLMHA)
def test_spec_parameter_deltas_in_the_base_config(base_counts, strategy):
    delta = base_counts(strategy) - base_counts()
    expected = spec_delta(strategy)
    assert abs(delta - expected) <= 0.01 * expected, (delta, expected)


def test_transparent_attention_adds_one_weight_per_encoder_state_and_decoder_layer(base_counts):
    assert base_counts("transparent") - base_counts() == (N_LAYERS + 1) * N_LAYERS


@pytest.mark.parametrize("strategy", MULTI_SOURCE)
def test_multi_source_parameter_deltas_in_the_base_config(base_counts, strategy):
    assert base_counts(strategy) - base_counts() == exact_multi_source_delta(strategy)


# thesis Table 3.4 (n = 2..6) and Table 3.2 (n = 6), #Params in M, baseline 61.2M.
# Table 3.4(a) lists Iter-S-Agg n=6 as 63.4M, but Table 3.2 gives the same model as 63.9M
# and 10 d^2 (SPEC) agrees with the latter; that one entry is taken from Table 3.2.
THESIS_PARAMS = {
    "s-agg": (61.8, 62.1, 62.3, 62.6, 62.8),
    "iter-s-agg": (61.8, 62.3, 62.8, 63.4, 63.9),
    "c-agg": (64.4, 65.5, 66.5, 67.6, 68.6),
    "iter-c-agg": (64.4, 67.6, 70.7, 73.9, 77.0),
    "m-00": (67.5, 73.8, 80.2, 86.4, 92.7),
    "m-01": (66.0, 70.7, 75.4, 80.2, 84.9),
    "m-10": (67.5, 73.8, 80.2, 86.4, 92.7),
    "m-11": (66.0, 70.7, 75.4, 80.2, 84.9),
}


@pytest.mark.parametrize("strategy", AGGREGATION + MLMHA)
def test_totals_match_thesis_tables_3_2_and_3_4(base_counts, strategy):
    baseline = base_counts(vocab=VOCAB_61_2M)
    assert round(baseline / 1e6, 1) == 61.2
    for n, expected in zip(range(2, 7), THESIS_PARAMS[strategy]):
        total = baseline + base_counts(strategy, n) - base_counts()  # deltas do not depend on V
        assert abs(total / 1e6 - expected) <= 0.15, (n, total, expected)
    assert base_counts(strategy, 6, vocab=VOCAB_61_2M) == baseline + base_counts(strategy) - base_counts()


def test_presets_of_the_mlmha_paper():
    with torch.device("meta"):
        small, args = build("transformer_jas_iwslt")
        base, base_args = build("transformer_jas_wmt_en_de")
    assert (args.joint_attention, args.joint_attention_layers, args.encoder_layers) == ("m-00", 4, 4)
    assert (base_args.joint_attention, base_args.joint_attention_layers) == ("m-10", 6)
    for model, (u0, u1), n in ((small, (False, False), 4), (base, (True, False), 6)):
        for layer in model.decoder.layers:
            attn = layer.encoder_attn
            assert isinstance(attn, MultiLayerMultiheadAttention)
            assert (attn.layer_specific, attn.sum_contexts, len(attn.k_proj)) == (u0, u1, n)


# ----------------------------------------------------------------------------------------
# 2. n = 1 is exactly the standard cross-attention
# ----------------------------------------------------------------------------------------
def stock_name(key):
    key = key.replace(".encoder_attn.attentions.0.", ".encoder_attn.")
    return re.sub(r"\.(q_proj|k_proj|v_proj)\.0\.", r".\1.", key)


@pytest.mark.parametrize("strategy", [s for s in STACKED if s not in NOT_STOCK_WITH_ONE_LAYER])
def test_one_collected_layer_is_the_stock_transformer(strategy):
    dictionary = make_dictionary()
    stock, _ = build_stock("transformer", *SMALL, dictionary=dictionary, seed=3)
    perturb(stock.double(), seed=5)
    ours, args, _ = small_model(strategy, n=1, dictionary=dictionary)
    assert args.joint_attention_layers == 1
    stock_state = stock.state_dict()
    renamed = {key: stock_name(key) for key in ours.state_dict()}
    assert sorted(renamed.values()) == sorted(stock_state)  # same parameters, nothing more
    ours.load_state_dict({key: stock_state[name] for key, name in renamed.items()})
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        expected, actual = stock(src, lengths, prev), ours(src, lengths, prev)
    torch.testing.assert_close(actual[0], expected[0], atol=1e-6, rtol=0)  # logits
    torch.testing.assert_close(actual[1]["attn"][0], expected[1]["attn"][0], atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------
# 3. each strategy against its equation
# ----------------------------------------------------------------------------------------
def random_sources(n, length=6, bsz=3, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    sources = [torch.randn(length, bsz, dim, generator=g, dtype=torch.double) for _ in range(n)]
    pad = torch.zeros(bsz, length, dtype=torch.bool)
    pad[1, :2] = True  # left padding, as fairseq batches sources
    pad[2, :4] = True
    query = torch.randn(4, bsz, dim, generator=g, dtype=torch.double)
    return sources, pad, query


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
    assert count(iterative) == count(linear)
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
    assert count(build_aggregation("iter-" + kind, 3)) > count(build_aggregation(kind, 3))


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


@pytest.mark.parametrize("strategy", ["flat", "hierarchical-shared"])
@pytest.mark.parametrize("n", [1, 3])
def test_flat_and_shared_hierarchical_equations(strategy, n):
    torch.manual_seed(0)
    attn = perturb(build_cross_attention(strategy, n).double().eval(), seed=1, scale=0.5)
    assert isinstance(attn, FlatOrHierarchicalCrossAttention) and attn.flat == (strategy == "flat")
    sources, pad, query = random_sources(n)
    out, weights = attn(query, torch.stack(sources, dim=2), key_padding_mask=pad, need_weights=True)
    ref = ref_flat if strategy == "flat" else ref_hierarchical_shared
    expected, expected_weights = ref(attn, query, sources, pad, with_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    # the returned weights (what alignments and the analyses read): B x Z x J, from the equations
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-6)


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


@pytest.mark.parametrize("strategy,n", [(s, L_SMALL) for s in ALL_OPTIONS] + [(s, 2) for s in STRATEGIES if s != "transparent"])
def test_model_forward_equals_the_equations(strategy, n):
    """Whole model: encoder memory (Collector + aggregation / transparent / stacking) and
    every decoder layer (query = output of the self-attention sublayer, the strategy's
    cross-attention sublayer(s) with residual and LayerNorm, FFN) against the references.
    For serial this is the chain x = LN_i(x + Att_i(x, f^i)), i = 1..n, in every layer."""
    model, args, dictionary = small_model(strategy, n=None if strategy == "none" else n)
    if strategy == "transparent":
        with torch.no_grad():
            model.encoder.transparent.weight.normal_(0.0, 1.0)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        memories = ref_memories(model, encoder_out, strategy, args.joint_attention_layers)
        if strategy in AGGREGATION:
            torch.testing.assert_close(encoder_out["joint_memory"][0], memories[0], atol=1e-10, rtol=0)
        elif strategy == "transparent":
            memory = encoder_out["joint_memory"][0]
            assert memory.shape[2] == len(model.decoder.layers)
            for j, expected in enumerate(memories):
                torch.testing.assert_close(memory[:, :, j], expected, atol=1e-6, rtol=0)
        elif strategy != "none":
            memory = encoder_out["joint_memory"][0]
            assert memory.shape[2] == n
            for i, f in enumerate(memories[0]):
                assert torch.equal(memory[:, :, i], f)
            assert torch.equal(memory[:, :, -1], encoder_out["encoder_out"][0])  # f^n = H^L
        features, _ = model.decoder(prev, encoder_out=encoder_out, features_only=True)
        expected = ref_decoder_features(model, strategy, n, encoder_out, prev)
    torch.testing.assert_close(features, expected, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# 4. incremental decoding and beam search
# ----------------------------------------------------------------------------------------
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


def test_identical_row_groups_divides_every_run_of_equal_rows():
    from fairseq_ext.modules.attention_utils import group_queries, identical_row_groups, ungroup

    a, b, c = (torch.full((5, 1, 2, 3), float(v)) for v in (1, 2, 3))
    assert identical_row_groups(torch.cat([a, a, b, b, c, c], dim=1)) == 2
    assert identical_row_groups(torch.cat([a, a, a, a, c, c], dim=1)) == 2  # equal neighbours merge runs
    assert identical_row_groups(torch.cat([a, a, b, c, c, c], dim=1)) == 1
    assert identical_row_groups(torch.cat([a, a, a], dim=1)) == 3
    nan = torch.full((5, 1, 2, 3), float("nan"))
    assert identical_row_groups(torch.cat([nan, nan], dim=1)) == 1  # never claims NaN rows equal
    q = torch.randn(6, 4, 1, 8)  # N x H x Z x D, sentence-major blocks of 3
    grouped = group_queries(q, 2)
    assert grouped.shape == (2, 4, 3, 8) and torch.equal(grouped[1, :, 2], q[5, :, 0])
    assert torch.equal(ungroup(grouped, 6), q)


def record_static_projections(model, step):
    """{module: [decoding steps]} of every projection of the source memory into keys (not the
    self-attention's): fairseq's k_proj of the stock cross-attentions, and the batched key
    and value projection of all n sources of the stacked-source attentions (MLMHA, flat,
    hierarchical-shared), called once for the keys and once for the values."""
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


# ----------------------------------------------------------------------------------------
# 5. padding
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ALL_OPTIONS)
def test_padded_batch_equals_each_sentence_alone(strategy):
    model, _, dictionary = small_model(strategy)
    src, lengths, prev = random_batch(dictionary, bsz=3, src_len=7)
    assert src.eq(dictionary.pad()).any()
    with torch.no_grad():
        batched = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
        for b in range(src.size(0)):
            alone = src[b : b + 1, src[b].ne(dictionary.pad())]
            single = model.get_normalized_probs(model(alone, lengths[b : b + 1], prev[b : b + 1]), log_probs=True)
            torch.testing.assert_close(batched[b : b + 1], single, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# 6. --mask-source-layer (thesis Table 3.5)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", STACKED)
@pytest.mark.parametrize("mask", [1, 2, 3])
def test_masked_source_layer_is_zeros_in_the_stacked_memory(strategy, mask):
    model, _, dictionary = small_model(strategy, "--mask-source-layer", str(mask))
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        out = model.encoder(src, src_lengths=lengths)
    memory = out["joint_memory"][0]
    states = out["encoder_states"]
    for i in range(1, L_SMALL + 1):
        if i == mask:
            assert torch.count_nonzero(memory[:, :, i - 1]) == 0
        else:
            assert torch.equal(memory[:, :, i - 1], states[i])


@pytest.mark.parametrize("strategy", AGGREGATION)
def test_masked_source_layer_is_zeros_before_aggregation(strategy):
    masked, _, dictionary = small_model(strategy, "--mask-source-layer", "2", n=2)
    plain, _, _ = small_model(strategy, n=2, dictionary=dictionary)
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        out = masked.encoder(src, src_lengths=lengths)
        states = out["encoder_states"]
        f1 = states[L_SMALL - 1]  # n = 2: f^1 = H^2, f^2 = H^3 (masked)
        expected = ref_aggregation(masked.encoder.layer_aggregation, strategy, [f1, torch.zeros_like(f1)])
        torch.testing.assert_close(out["joint_memory"][0], expected, atol=1e-10, rtol=0)
        unmasked = plain.encoder(src, src_lengths=lengths)["joint_memory"][0]
    assert not torch.allclose(out["joint_memory"][0], unmasked)


@pytest.mark.parametrize("strategy,n,mask", [("m-00", 3, 0), ("m-00", 3, 4), ("m-10", 2, 3), ("s-agg", 2, 3),
                                             ("serial", 1, 2), ("none", None, 1), ("transparent", None, 1)])
def test_mask_source_layer_out_of_range_fails_at_build(strategy, n, mask):
    flags = ("--mask-source-layer", str(mask))
    with pytest.raises(ValueError, match="--mask-source-layer"):
        small_model(strategy, *flags, n=n)


# ----------------------------------------------------------------------------------------
# 7. invalid settings fail at build, naming the option
# ----------------------------------------------------------------------------------------
def test_more_collected_layers_than_encoder_layers_fails_at_build():
    with pytest.raises(ValueError, match=r"--joint-attention-layers \(4\) exceeds --encoder-layers \(3\)"):
        small_model("m-00", n=4)
    with pytest.raises(ValueError, match="--joint-attention-layers"):
        small_model("c-agg", n=0)
    with pytest.raises(ValueError, match="--joint-attention-layers"):
        small_model("none", n=2)


def test_unknown_strategy_fails_at_build():
    args = parse_model_args("multilayer_transformer", *SMALL, "--joint-attention", "m-00")
    args.joint_attention = "m-22"
    with pytest.raises(ValueError, match="--joint-attention"):
        parse_options(args)
    dictionary = make_dictionary()
    task = type("Task", (), {"source_dictionary": dictionary, "target_dictionary": dictionary})()
    with pytest.raises(ValueError, match="--joint-attention"):
        MultilayerTransformerModel.build_model(args, task)
    with pytest.raises(SystemExit):  # argparse choices guard the command line
        parse_model_args("multilayer_transformer", *SMALL, "--joint-attention", "m-22")


# ----------------------------------------------------------------------------------------
# 8. a short training run per strategy on a slice of Multi30k
# ----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ALL_OPTIONS)
def test_training_lowers_the_validation_loss(strategy, multi30k_bin, tmp_path, monkeypatch):
    """fairseq-train's own main, in-process: the validation loss after the last epoch is
    well below the one after the first epoch."""
    extra = () if strategy == "none" else ("--joint-attention", strategy)
    losses = train_recording_validation(multi30k_bin, tmp_path, monkeypatch, *MULTI30K_TRAIN_FLAGS, "--no-save", *extra)
    assert len(losses) >= 3, losses
    assert losses[-1] < losses[0] - 1.0, losses


def test_transparent_attention_rejects_a_number_of_collected_layers():
    with pytest.raises(ValueError, match="--joint-attention-layers"):
        small_model("transparent", n=2)


# ----------------------------------------------------------------------------------------
# 9. the strategy table: one entry is all a new strategy needs
# ----------------------------------------------------------------------------------------
def test_every_strategy_choice_comes_from_the_table():
    from fairseq_ext.models.joint_attention_strategies import STRATEGIES
    from fairseq_ext.models.multilayer_transformer_config import MultilayerTransformerConfig

    choices = [c.value for c in MultilayerTransformerConfig.__dataclass_fields__["joint_attention"].type]
    assert choices == list(STRATEGIES)


def test_the_equation_families_are_rows_of_the_table():
    assert set(MLMHA + MULTI_SOURCE) <= set(STACKED) and set(NOT_STOCK_WITH_ONE_LAYER) <= set(STACKED)
    assert set(MLMHA) <= set(SHARES_STATIC_ROWS)


def test_a_new_table_entry_is_a_working_strategy(monkeypatch):
    """A strategy added as one table entry (here: the parallel combination with the
    stock cross-attention summed over the n layers, under a new name) builds, decodes
    incrementally and runs beam search, with nothing else changed."""
    entry = table.JointAttentionStrategy(
        "sum-of-layers", Memory.STACKED,
        build_cross_attention=lambda spec: ParallelCrossAttention(spec.embed_dim, spec.num_heads, spec.num_sources,
                                                                  spec.dropout))
    monkeypatch.setitem(table.STRATEGIES, entry.name, entry)
    args = parse_model_args("multilayer_transformer", *SMALL, "--joint-attention", "parallel")
    args.joint_attention = entry.name
    dictionary = make_dictionary()
    task = type("Task", (), {"source_dictionary": dictionary, "target_dictionary": dictionary})()
    model = MultilayerTransformerModel.build_model(args, task).eval()
    assert isinstance(model.decoder.layers[0].encoder_attn, ParallelCrossAttention)
    src, lengths, prev = random_batch(dictionary, beam=2)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    torch.testing.assert_close(full, incremental, rtol=0, atol=1e-5)
    src, lengths, _ = random_batch(dictionary, bsz=4, seed=3)
    beam_search_rescored(model, dictionary, src, lengths, beam_size=2, max_len_b=5)


# ----------------------------------------------------------------------------------------
# 10. layer masking removes the layer (issue 10.5): a masked f^i contributes nothing, as in
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
        return FlatOrHierarchicalCrossAttention(16, 4, num, flat=True, removed_source=removed_source)
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


@pytest.mark.parametrize("strategy,mask", [("serial", L_SMALL), ("serial", 1), ("m-00", 2), ("m-11", 1),
                                           ("parallel", 2), ("flat", 3), ("hierarchical", 2)])
def test_masked_models_decode_incrementally(strategy, mask):
    model, _, dictionary = small_model(strategy, "--mask-source-layer", str(mask))
    if strategy == "serial" and mask == L_SMALL:
        assert all(layer.encoder_attn.removed for layer in model.decoder.layers)
    src, lengths, prev = random_batch(dictionary, beam=2)
    full, incremental = full_and_incremental(model, src, lengths, prev, permute_at=2, beam=2)
    torch.testing.assert_close(full, incremental, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# 11. a copy of a model is a model (copy.deepcopy: fairseq's EMA, distillation teachers)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags", [("--joint-attention", "serial"),
                                   ("--aux-decoder-layers", "1", "--aux-fusion")])
def test_a_deep_copy_computes_what_the_model_computes_with_its_own_weights(flags):
    import copy

    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, *flags, dictionary=dictionary)
    model.eval()
    src, lengths, prev = random_batch(dictionary)
    with torch.no_grad():
        expected, _ = model(src, lengths, prev)
        clone = copy.deepcopy(model)
        perturb(model, seed=3)  # the original changes; the copy must not
        actual, _ = clone(src, lengths, prev)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------
# 12. every strategy's cross-attention reports its weights through the modules' contract
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ALL_OPTIONS)
def test_every_strategy_reports_its_attention_weights(strategy):
    """Recording (fairseq_ext.modules.attention_utils.record_attention_weights) every
    decoder layer's cross-attention part: each reports its per-head weights, batch-first,
    rows summing to 1 (flat: its per-source maps together), and the output is unchanged."""
    from fairseq_ext.modules.attention_utils import ReportsAttentionWeights, record_attention_weights

    model, args, dictionary = small_model(strategy)
    src, lengths, prev = random_batch(dictionary)
    parts = [m for layer in model.decoder.layers for m in (layer.serial_stack, layer.encoder_attn) if m is not None]
    assert all(isinstance(m, ReportsAttentionWeights) for m in parts)
    with torch.no_grad():
        plain, _ = model(src, lengths, prev)
        with record_attention_weights(parts) as recorder:
            recorded, _ = model(src, lengths, prev)
    torch.testing.assert_close(recorded, plain, atol=1e-6, rtol=0)
    bsz, heads, tgt_len = src.size(0), args.decoder_attention_heads, prev.size(1)
    for layer in model.decoder.layers:
        report = recorder.last(layer.encoder_attn)
        weights = report["attention"]
        assert weights.shape[:3] == (bsz, heads, tgt_len) and weights.size(-1) == src.size(1)
        per_source = dict(report.get("per_source", {}))
        if layer.serial_stack is not None:
            per_source.update(recorder.last(layer.serial_stack)["per_source"])
        if isinstance(layer.encoder_attn, FlatOrHierarchicalCrossAttention) and layer.encoder_attn.flat:
            total = sum(per_source.values()).sum(-1)
            torch.testing.assert_close(total, torch.ones(weights.shape[:-1], dtype=weights.dtype))
            continue
        for w in [weights, *per_source.values()]:
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1], dtype=w.dtype))
        if table.STRATEGIES[strategy].memory is Memory.STACKED and strategy not in ("m-00", "m-01"):
            assert sorted(per_source) == list(range(args.joint_attention_layers))  # U0 = 0: one joint map
