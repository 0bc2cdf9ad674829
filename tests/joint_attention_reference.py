"""Plain-torch references of the joint-attention equations (thesis Sec. 3.2, Eq. 3.1-3.11;
MLMHA paper; multi-source input combination paper Sec. 3), written out independently of
``fairseq_ext.modules.attention_utils`` (they only read the modules' parameters), and the rows
of the strategy table grouped by equation family, with the small models the joint-attention
tests build from them (tests/modules/test_joint_attention_equations.py and
tests/models/test_joint_attention_*.py)."""
import math

import torch
import torch.nn.functional as F

from fairseq_ext.models import joint_attention_strategies as table
from fairseq_ext.models.joint_attention_strategies import CrossAttentionSpec, Memory, MemorySpec
from fairseq_ext.modules.stacked_source_attention import StackedSourceAttention
from model_utils import SMALL, build, make_dictionary

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
MULTI_SOURCE = ("serial", "parallel", "flat", "hierarchical")
# every row of the table and the option sets beside it, each the flags of one model: what the
# tests of every precision and of pre-norm layers take through training and decoding
OPTION_SETS = {
    **{s: (() if s == "none" else ("--joint-attention", s)) for s in ALL_OPTIONS},
    "dc": ("--encoder-self-attention", "dc", "--decoder-self-attention", "dc", "--dc-kernel-size", "2"),
    "mma": ("--encoder-self-attention", "mma", "--decoder-self-attention", "mma"),
    "ms": ("--aux-decoder-layers", "1,2"),
    "aif": ("--aux-decoder-layers", "1", "--aux-fusion"),
    "pre-classifier": ("--pre-classifier-projection",),
    "combined": ("--joint-attention", "m-10", "--encoder-self-attention", "dc", "--decoder-self-attention", "mma",
                 "--dc-kernel-size", "2", "--aux-decoder-layers", "1", "--aux-fusion", "--pre-classifier-projection"),
}


# pre-norm layers (fairseq's --*-normalize-before) and the option sets they are tested with:
# every set above, AIF with two auxiliary decoders (its sum) and serial with AIF
PRE_NORM = ("--encoder-normalize-before", "--decoder-normalize-before")
PRE_NORM_OPTION_SETS = {
    **OPTION_SETS,
    "aif": ("--aux-decoder-layers", "1,2", "--aux-fusion"),
    "serial+aif": ("--joint-attention", "serial", "--aux-decoder-layers", "1", "--aux-fusion"),
}


def perturb(module, seed=0, scale=0.2):
    """Random everything (biases and LayerNorms included), so that no term of an equation
    can hide behind a zero or one initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def small_model(strategy, *flags, n=None, seed=0, dictionary=None):
    """A SMALL model with ``strategy`` over ``n`` collected layers, in float64 with perturbed
    weights: (model, args, dictionary)."""
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
    combine = {"parallel": ref_parallel, "flat": ref_flat, "hierarchical": ref_hierarchical}[strategy]
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


def random_sources(n, length=6, bsz=3, dim=16, seed=0):
    """n source layers (J x B x C each, float64), their left-padding mask (B x J) and a query
    (4 x B x C)."""
    g = torch.Generator().manual_seed(seed)
    sources = [torch.randn(length, bsz, dim, generator=g, dtype=torch.double) for _ in range(n)]
    pad = torch.zeros(bsz, length, dtype=torch.bool)
    pad[1, :2] = True  # left padding, as fairseq batches sources
    pad[2, :4] = True
    query = torch.randn(4, bsz, dim, generator=g, dtype=torch.double)
    return sources, pad, query


def attention_by_hand(attn, query, key, pad):
    """softmax(q k^T / sqrt(d)) of every head, B x H x T x S, from the module's projections."""
    heads = attn.num_heads
    d = query.size(-1) // heads
    t, b, s = query.size(0), query.size(1), key.size(0)
    q = attn.q_proj(query).view(t, b, heads, d).permute(1, 2, 0, 3).double() * d ** -0.5
    k = attn.k_proj(key).view(s, b, heads, d).permute(1, 2, 0, 3).double()
    logits = q @ k.transpose(-1, -2)
    if pad is not None:
        logits = logits.masked_fill(pad[:, None, None, :], float("-inf"))
    return torch.softmax(logits, -1)
