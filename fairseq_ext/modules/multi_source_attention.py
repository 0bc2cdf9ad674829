"""Multi-source input combination strategies for the encoder-decoder attention
(Libovicky, Helcl & Marecek 2018, "Input Combination Strategies for Multi-Source
Transformer Decoder", Sec. 3), applied with the top n encoder layers as the n sources.

- serial (Fig. 1a): one cross-attention sublayer per source, each with its own residual
  connection and LayerNorm, applied one after another (f^1 first, f^n last). The last one
  is the decoder layer's own cross-attention sublayer (`SourceSelectAttention` over f^n);
  the n-1 before it live in `SerialCrossAttentionStack`.
- parallel (Eq. 4): the sum of n independent cross-attentions, one residual.
- flat (Eq. 5-6): one attention over the concatenation of all sources' states along the
  length axis: one set of query/key/value projections shared by all sources (the paper:
  "the intermediate projection of the states of each encoder is not necessary").
- hierarchical (Eq. 7-8, with A^h of Eq. 2-3): one full multi-head attention per source
  (own W^Q, W^K, W^V, W^O each), then a second full multi-head attention with its own
  projections whose keys and values, at each target position, are the n per-source
  contexts (`HierarchicalCrossAttention`). With n = 1 the second level attends a single
  context with weight 1, so the output is the stock cross-attention followed by an affine
  map (W^O_2 W^V_2).
"""
from typing import Optional

import torch
import torch.nn as nn
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

from fairseq_ext.modules.attention_utils import (
    QKV_GAIN,
    RecordingMultiheadAttention,
    ReportsAttentionWeights,
    attend_by_sentence,
    attention_weights_for_output,
    group_mask,
    group_queries,
    head_weights_for_output,
    made_while_unchanged,
    merge_heads,
    scaled_logits,
    softmax_float,
    source_mask,
    split_heads,
    ungroup,
    xavier_linear,
)
from fairseq_ext.modules.stacked_source_attention import (SentenceCachedAttention, StackedSourceAttention,
                                                         reorder_static, static_per_sentence)


def without_source(key_padding_mask: Optional[Tensor], num_sources: int, removed: Optional[int],
                   bsz: int, length: int, device) -> Optional[Tensor]:
    """A B x n x J padding mask in which every position of source ``removed`` is padding
    (the analysis of thesis Table 3.5: that layer takes no part)."""
    if removed is None:
        return key_padding_mask
    if key_padding_mask is None:
        mask = torch.zeros(bsz, num_sources, length, dtype=torch.bool, device=device)
    elif key_padding_mask.dim() == 2:
        mask = key_padding_mask.to(torch.bool).unsqueeze(1).repeat(1, num_sources, 1)
    else:
        mask = key_padding_mask.to(torch.bool).clone()
    mask[:, removed] = True
    return mask


def cross_attention(embed_dim: int, num_heads: int, dropout: float, cls=RecordingMultiheadAttention, **kwargs):
    """A stock fairseq encoder-decoder attention (that reports its weights when recording)."""
    return cls(embed_dim, num_heads, dropout=dropout, encoder_decoder_attention=True, **kwargs)


class SourceSelectAttention(SentenceCachedAttention):
    """fairseq's cross-attention reading one slice of a stacked memory (J x B x n x C), its keys
    and values cached once per sentence in decoding.

    Used as the decoder layer's own cross-attention where the layer reads one of several
    memories: the last serial sublayer (f^n) and transparent attention (the memory of
    decoder layer j). Its parameters keep the stock names, so stock weights load.
    ``one_of_n_sources``: the slice is source ``source_index`` of a combination (serial), so
    its map is also reported as that source's (transparent's slice is its layer's memory).
    """

    def __init__(self, *args, source_index: int, removed: bool = False, one_of_n_sources: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.source_index = source_index
        self.removed = removed  # layer masking (thesis Table 3.5): the sublayer adds nothing
        self.one_of_n_sources = one_of_n_sources

    def forward(self, query, key, value, key_padding_mask=None, *args, **kwargs):
        if self.removed:
            return torch.zeros_like(query), None
        if key is not None and key.dim() == 4:
            key = value = key[:, :, self.source_index]
        return super().forward(query, key, value, source_mask(key_padding_mask, self.source_index), *args, **kwargs)

    def report_weights(self, **report) -> None:
        if self.one_of_n_sources and report.get("attention") is not None:
            report["per_source"] = {self.source_index: report["attention"]}
        super().report_weights(**report)


class SerialCrossAttentionStack(nn.Module, ReportsAttentionWeights):
    """The first n-1 sublayers of the serial strategy (f^1 .. f^{n-1}), each
    x <- LayerNorm(x + dropout(Att(x, f^i))) (post-norm) or x + dropout(Att(LN(x), f^i))
    (pre-norm). The decoder layer's own cross-attention then attends f^n."""

    def __init__(self, embed_dim: int, num_heads: int, num_sources: int, attention_dropout: float,
                 dropout: float, normalize_before: bool, removed_source: Optional[int] = None):
        super().__init__()
        self.removed_source = removed_source  # layer masking: that sublayer is skipped
        self.attentions = nn.ModuleList(
            cross_attention(embed_dim, num_heads, attention_dropout, cls=SentenceCachedAttention)
            for _ in range(num_sources - 1)
        )
        self.layer_norms = nn.ModuleList(LayerNorm(embed_dim) for _ in range(num_sources - 1))
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.normalize_before = normalize_before

    def forward(self, x: Tensor, memory: Tensor, key_padding_mask: Optional[Tensor], incremental_state=None):
        """x: Z x B x C; memory: J x B x n x C (may be None once cached). Reports the
        sublayers' maps as ``per_source`` (f^1 .. f^{n-1})."""
        recording, per_source = self.recording_weights, {}
        for i, (attn, norm) in enumerate(zip(self.attentions, self.layer_norms)):
            if i == self.removed_source:
                continue
            residual = x
            if self.normalize_before:
                x = norm(x)
            source = memory[:, :, i] if memory is not None else None
            x, weights = attn(query=x, key=source, value=source, key_padding_mask=source_mask(key_padding_mask, i),
                              incremental_state=incremental_state, static_kv=True, need_weights=recording,
                              need_head_weights=recording)
            if recording:
                per_source[i] = weights.transpose(0, 1)
            x = residual + self.dropout_module(x)
            if not self.normalize_before:
                x = norm(x)
        if recording:
            self.report_weights(per_source=per_source)
        return x


class ParallelCrossAttention(nn.Module, ReportsAttentionWeights):
    """Eq. 4: sum_i Att_i(Q, f^i) with n independent cross-attentions (one residual,
    applied by the decoder layer)."""

    def __init__(self, embed_dim: int, num_heads: int, num_sources: int, dropout: float = 0.0,
                 removed_source: Optional[int] = None):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.removed_source = removed_source  # layer masking: that attention leaves the sum
        self.attentions = nn.ModuleList(
            cross_attention(embed_dim, num_heads, dropout) for _ in range(num_sources)
        )

    def forward(self, query, key, value=None, key_padding_mask=None, incremental_state=None,
                need_weights=False, need_head_weights=False, **unused):
        recording = self.recording_weights
        outputs, weights, per_source = [], [], {}
        for i, attn in enumerate(self.attentions):
            if i == self.removed_source:
                continue
            source = key[:, :, i] if key is not None else None
            out, w = attn(query=query, key=source, value=source, key_padding_mask=source_mask(key_padding_mask, i),
                          incremental_state=incremental_state, static_kv=True,
                          need_weights=need_weights or recording, need_head_weights=need_head_weights or recording)
            if recording:
                per_source[i] = w.transpose(0, 1)
                w = head_weights_for_output(w, need_weights, need_head_weights)
            outputs.append(out)
            weights.append(w)
        if recording:
            self.report_weights(attention=torch.stack(list(per_source.values())).mean(dim=0), per_source=per_source)
        attn_weights = torch.stack(weights).mean(dim=0) if weights[0] is not None else None
        return torch.stack(outputs).sum(dim=0), attn_weights


@with_incremental_state
class HierarchicalCrossAttention(nn.Module, ReportsAttentionWeights):
    """Eq. 7-8: A^h_hier(Q, K_1:n, V_1:n) = A^h(Q, K_hier, V_hier) with
    K_hier = V_hier = concat_i A^h_i(Q, K_i, V_i): n independent multi-head attentions
    (stock fairseq cross-attentions, each with its own four projections), then one more
    multi-head attention, with its own projections, in which each target position attends
    its own n contexts. One residual, applied by the decoder layer.

    Training and incremental decoding compute the n first-level attentions together
    (:meth:`decode_sources`, as fairseq's ``MultiheadAttention`` computes each), their static keys
    and values cached once per sentence in decoding, and the second level as n-long sums
    (:meth:`decode_contexts`); a full forward in evaluation (scoring, the analyses) runs the n
    fairseq attentions one by one."""

    def __init__(self, embed_dim: int, num_heads: int, num_sources: int, dropout: float = 0.0,
                 kdim: Optional[int] = None, removed_source: Optional[int] = None):
        super().__init__()
        kdim = kdim or embed_dim
        self.removed_source = removed_source  # layer masking: its context is not attended
        self.source_attentions = nn.ModuleList(
            cross_attention(embed_dim, num_heads, dropout, kdim=kdim, vdim=kdim) for _ in range(num_sources)
        )
        self.context_attention = cross_attention(embed_dim, num_heads, dropout)

    def forward(self, query, key, value=None, key_padding_mask=None, incremental_state=None,
                need_weights=False, need_head_weights=False, **unused):
        """query: Z x B x C; key: the stacked sources J x B x n x C (None once cached).
        Returns Z x B x C and, when asked, the first-level weights of each source scaled by
        the second-level weight of that source and summed over the sources (B x Z x J;
        H x B x Z x J with ``need_head_weights``, where the second level is head-averaged)."""
        recording = self.recording_weights
        asked_heads = need_head_weights
        need_head_weights = need_head_weights or recording  # recording: per head, averaged on return
        want_weights = need_weights or need_head_weights
        fused = not recording and (self.training or incremental_state is not None)
        if fused:
            contexts, weights = self.decode_sources(query, key, key_padding_mask, incremental_state, want_weights,
                                                    need_head_weights)
        else:
            contexts, weights = [], []
            for i, attn in enumerate(self.source_attentions):
                source = key[:, :, i] if key is not None else None
                context, w = attn(query=query, key=source, value=source,
                                  key_padding_mask=source_mask(key_padding_mask, i), incremental_state=incremental_state,
                                  static_kv=True, need_weights=want_weights, need_head_weights=need_head_weights)
                contexts.append(context)  # Z x B x C
                weights.append(w)
        tgt_len, bsz, dim = query.shape
        # the second level: each of the Z x B positions attends its own n contexts
        hier = torch.stack(contexts, dim=0).reshape(len(contexts), tgt_len * bsz, dim)  # n x (Z B) x C
        context_mask = None
        if self.removed_source is not None:
            context_mask = torch.zeros(tgt_len * bsz, len(contexts), dtype=torch.bool, device=query.device)
            context_mask[:, self.removed_source] = True
        attend = self.decode_contexts if fused else self.context_attention
        out, beta = attend(query=query.reshape(1, tgt_len * bsz, dim), key=hier, value=hier,
                           key_padding_mask=context_mask, need_weights=want_weights)
        out = out.view(tgt_len, bsz, dim)
        if not want_weights:
            return out, None
        beta = beta.view(tgt_len, bsz, len(contexts)).transpose(0, 1)  # B x Z x n, head-averaged
        combined = (torch.stack(weights, dim=-1) * beta[..., None, :]).sum(-1)  # broadcasts over H
        if recording:
            self.report_weights(attention=combined.transpose(0, 1), beta=beta.unsqueeze(1),
                                per_source={i: w.transpose(0, 1) for i, w in enumerate(weights)})
            return out, head_weights_for_output(combined, need_weights, asked_heads)
        return out, combined

    def decode_sources(self, query: Tensor, key: Optional[Tensor], key_padding_mask: Optional[Tensor],
                       incremental_state, want_weights: bool, need_head_weights: bool):
        """The n first-level attentions together (a training step, or a decoding step with the
        static keys and values of each sentence cached once): each source's context
        (Z x B x C) and, when asked, its weights as its ``MultiheadAttention`` returns them
        (H x B x Z x J per head, or B x Z x J averaged)."""
        attentions = self.source_attentions
        first = attentions[0]
        heads, head_dim = first.num_heads, first.head_dim

        def project(memory: Tensor):  # J x R x n x C -> R x n x H x J x D, by each attention's own k/v_proj
            def per_source(name):
                out = torch.stack([getattr(a, name)(memory[:, :, i]) for i, a in enumerate(attentions)], dim=2)
                return out.unflatten(-1, (heads, head_dim)).permute(1, 2, 3, 0, 4).contiguous()

            return per_source("k_proj"), per_source("v_proj")

        k, v = static_per_sentence(self, key, incremental_state, project)
        stacked = self.stacked_projections()
        tgt_len, bsz, dim = query.shape
        q = torch.einsum("zbc,noc->zbno", query, stacked["q_proj_weight"]) + stacked["q_proj_bias"]
        q = q * first.scaling  # Z x B x n x C
        q = group_queries(q.unflatten(-1, (heads, head_dim)).permute(1, 2, 3, 0, 4), k.size(0))  # R x n x H x gZ x D
        logits = torch.matmul(q, k.transpose(-1, -2))  # R x n x H x gZ x J
        mask = group_mask(key_padding_mask, k.size(0))
        if mask is not None:
            mask = mask.to(torch.bool)
            mask = mask[:, None, None, None, :] if mask.dim() == 2 else mask[:, :, None, None, :]
            logits = logits.masked_fill(mask, float("-inf"))
        probs = softmax_float(logits)  # in fp32, as fairseq's utils.softmax
        context = ungroup(torch.matmul(first.dropout_module(probs), v), bsz)  # B x n x H x Z x D
        context = context.permute(3, 0, 1, 2, 4).flatten(-2)  # Z x B x n x C
        contexts = torch.einsum("zbni,noi->zbno", context, stacked["out_proj_weight"]) + stacked["out_proj_bias"]
        contexts = contexts.unbind(2)
        if not want_weights:
            return list(contexts), [None] * len(attentions)
        probs = ungroup(probs, bsz)  # B x n x H x Z x J
        if need_head_weights:
            return list(contexts), list(probs.permute(1, 2, 0, 3, 4).unbind(0))
        return list(contexts), list(probs.mean(dim=2).unbind(1))

    def stacked_projections(self) -> dict:
        """The n first-level attentions' query and output projections stacked (n x C x C,
        n x C), made again only when a weight changed (a training step, a load)."""
        projections = [(name, part) for name in ("q_proj", "out_proj") for part in ("weight", "bias")]
        parts = [getattr(getattr(a, name), part) for name, part in projections for a in self.source_attentions]
        names = [f"{name}_{part}" for name, part in projections]
        n = len(self.source_attentions)
        return made_while_unchanged(self, "_stacked", parts, lambda ts: {
            key: torch.stack(ts[i * n:(i + 1) * n]) for i, key in enumerate(names)})

    def decode_contexts(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Optional[Tensor],
                        need_weights: bool):
        """The second level in training and decoding, as ``self.context_attention`` (a fairseq
        ``MultiheadAttention``) computes it, without its general path: each of the N = Z B
        positions attends its own n contexts, so the products are n-long sums, not matmuls.
        query: 1 x N x C; key = value: the contexts n x N x C. Returns 1 x N x C and, when
        asked, the head-averaged weights N x 1 x n."""
        attn = self.context_attention
        heads, head_dim = attn.num_heads, attn.head_dim
        q = (attn.q_proj(query) * attn.scaling).view(-1, heads, 1, head_dim)  # N x H x 1 x D
        k = attn.k_proj(key).view(key.size(0), -1, heads, head_dim).permute(1, 2, 0, 3)  # N x H x n x D
        v = attn.v_proj(value).view(value.size(0), -1, heads, head_dim).permute(1, 2, 0, 3)
        logits = (q * k).sum(-1)  # N x H x n
        if key_padding_mask is not None:
            logits = logits.masked_fill(key_padding_mask[:, None, :].to(torch.bool), float("-inf"))
        probs = softmax_float(logits)  # in fp32, as fairseq's utils.softmax
        context = (attn.dropout_module(probs).unsqueeze(-1) * v).sum(-2)  # N x H x D
        out = attn.out_proj(context.reshape(1, -1, heads * head_dim))
        return out, (probs.mean(dim=1).unsqueeze(1) if need_weights else None)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        reorder_static(self, incremental_state, new_order)


def flat_attention(q: Tensor, k: Tensor, v: Tensor, num_sources: int, key_padding_mask, dropout, every_weight=True):
    """Eq. 5-6 on head-split tensors: one softmax over all sources' positions.
    q: B x H x Z x D; k, v: the n sources side by side along the length axis, B x H x (n J) x D.
    Returns the context B x H x Z x D, the weights summed over the sources per source position
    (B x H x Z x J) and, ``every_weight``, the weights themselves (B x H x Z x (n J))."""
    if key_padding_mask is None:
        mask = None
    elif key_padding_mask.dim() == 3:  # one row per source: B x n x J -> B x (n J)
        mask = key_padding_mask.flatten(1)
    else:
        mask = key_padding_mask.repeat(1, num_sources)
    weights = softmax_float(scaled_logits(q, k, mask))
    context = torch.matmul(dropout(weights), v)
    per_position = weights.unflatten(-1, (num_sources, -1)).sum(dim=-2)
    return (context, per_position, weights) if every_weight else (context, per_position)


class FlatCrossAttention(StackedSourceAttention, ReportsAttentionWeights):
    """Flat (Eq. 5-6) combination over n stacked sources: one query projection, one key and
    one value projection shared by all sources, one output projection."""

    def __init__(self, embed_dim: int, num_heads: int, num_sources: int, dropout: float = 0.0,
                 kdim: Optional[int] = None, removed_source: Optional[int] = None):
        super().__init__(embed_dim, num_heads, num_sources, dropout, kdim, shared_kv=True)
        self.removed_source = removed_source  # layer masking: every position of it is masked
        self.q_proj = xavier_linear(embed_dim, embed_dim, gain=QKV_GAIN)
        self.out_proj = xavier_linear(embed_dim, embed_dim)

    def forward(self, query, key, value=None, key_padding_mask=None, incremental_state=None,
                need_weights=False, need_head_weights=False, **unused):
        q = split_heads(self.q_proj(query), self.num_heads)
        # the sources side by side along the length axis (B x H x (n J) x D): the layout every
        # step reads, made (and cached) once per sentence
        side_by_side = lambda t: t.transpose(1, 2).flatten(2, 3)  # noqa: E731
        k, v = self.static_keys_values(key, incremental_state, side_by_side, side_by_side)
        if self.removed_source is not None:
            key_padding_mask = without_source(key_padding_mask, self.num_sources, self.removed_source, q.size(0),
                                              k.size(2) // self.num_sources, q.device)
        context, weights, *all_weights = attend_by_sentence(  # k: one row per sentence in decoding (see the base)
            lambda queries, mask: flat_attention(queries, k, v, self.num_sources, mask, self.dropout_module,
                                                 self.recording_weights), q, k.size(0), key_padding_mask)
        if self.recording_weights:  # the one softmax split per source: together they sum to 1
            per_source = all_weights[0].unflatten(-1, (self.num_sources, -1)).unbind(-2)
            self.report_weights(attention=weights, per_source=dict(enumerate(per_source)))
        return self.out_proj(merge_heads(context)), attention_weights_for_output(
            weights, need_weights, need_head_weights
        )
