"""Small pieces shared by the attention modules: projections, head reshaping, masks,
softmaxes, the incremental-decoding cache helpers, and the contract by which every attention
module of the plugin reports its weights to the analyses."""
import contextlib
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from fairseq.modules import MultiheadAttention
from torch import Tensor


QKV_GAIN = 2 ** -0.5  # fairseq's scaled initialisation of the q/k/v projections


def xavier_linear(in_features: int, out_features: int, bias: bool = True, gain: float = 1.0):
    """A Linear initialised as fairseq's MultiheadAttention initialises its projections."""
    m = nn.Linear(in_features, out_features, bias=bias)
    nn.init.xavier_uniform_(m.weight, gain=gain)
    if bias:
        nn.init.constant_(m.bias, 0.0)
    return m


def made_while_unchanged(owner: nn.Module, name: str, tensors: List[Tensor], make):
    """``make(tensors)`` (e.g. weights concatenated for one matmul), kept on ``owner`` under
    ``name`` while no tensor changed (an in-place update bumps its version; a load replaces
    it) and autograd is off (decoding): then every step reuses it instead of copying the
    weights again. With autograd on it is made at every call, so that its graph is fresh."""
    if torch.is_grad_enabled():
        return make(tensors)
    version = tuple((t.data_ptr(), t._version, t.dtype) for t in tensors)
    cached = owner.__dict__.get(name)
    if cached is None or cached[0] != version:
        cached = (version, make(tensors))
        owner.__dict__[name] = cached
    return cached[1]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """T x B x C -> B x H x T x (C / H)."""
    length, bsz, dim = x.shape
    return x.contiguous().view(length, bsz, num_heads, dim // num_heads).permute(1, 2, 0, 3)


def merge_heads(x: Tensor) -> Tensor:
    """B x H x T x D -> T x B x (H * D)."""
    bsz, heads, length, head_dim = x.shape
    return x.permute(2, 0, 1, 3).reshape(length, bsz, heads * head_dim)


def scaled_logits(q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
    """(B x H x Z x D, B x H x J x D) -> B x H x Z x J logits, padded keys at -inf."""
    logits = torch.matmul(q, k.transpose(-1, -2)).div_(math.sqrt(q.size(-1)))  # in place: a step allocates less
    if key_padding_mask is not None:
        logits.masked_fill_(key_padding_mask[:, None, None, :].to(torch.bool), float("-inf"))
    return logits


def source_mask(key_padding_mask: Optional[Tensor], index: int) -> Optional[Tensor]:
    """The padding mask of source ``index``: one B x J mask shared by every source (encoder
    layers of one sentence) or a B x n x J mask with one row per source (different source
    sentences, multi-source translation)."""
    if key_padding_mask is None or key_padding_mask.dim() == 2:
        return key_padding_mask
    return key_padding_mask[:, index]


def softmax_float(logits: Tensor) -> Tensor:
    """Softmax in fp32 (as fairseq does under fp16/bf16), returned in the input dtype."""
    return torch.softmax(logits.float(), dim=-1).type_as(logits)


def attention_weights_for_output(
    weights: Tensor, need_weights: bool, need_head_weights: bool
) -> Optional[Tensor]:
    """B x H x Z x J -> fairseq's layout: H x B x Z x J per head, or B x Z x J averaged."""
    if not (need_weights or need_head_weights):
        return None
    if need_head_weights:
        return weights.transpose(0, 1)
    return weights.mean(dim=1)


# ---- attention weights reported to the analyses -------------------------------------------
# Every attention module of the plugin (self- and cross-attention) derives from
# ReportsAttentionWeights. While ``record_attention_weights(modules)`` is active, each of
# those modules computes its per-head weights and reports them once per forward call to the
# recorder, a dict batch-first and detached:
#
#   "attention":  B x H x Z x J  what the module returns with need_head_weights (its
#                                combined map over the keys it attends)
#   "per_source": {i: B x H x Z x J}  each source's own map, for the modules over n stacked
#                                sources (i = 0..n-1; a masked source is left out)
#   "beta":       B x H' x Z x n  the weights over the n per-source contexts (hierarchical
#                                forms; H' = 1 where the module averages its heads)
#   "local":      B x H x T x S  the local FI unit's map (Dual Contextual attention)
#
# Recording never changes what a module returns to its caller, nor its output.
class AttentionWeightsRecorder:
    """The registry the analyses read: ``reports[module]`` lists what ``module`` reported,
    one dict per forward call (see above); :meth:`last` is the latest one. ``on_report``,
    if given, is called with (module, report) as each report arrives."""

    def __init__(self, on_report=None):
        self.reports: Dict[nn.Module, List[Dict]] = {}
        self.on_report = on_report

    def __call__(self, module: nn.Module, report: Dict) -> None:
        self.reports.setdefault(module, []).append(report)
        if self.on_report is not None:
            self.on_report(module, report)

    def last(self, module: nn.Module) -> Optional[Dict]:
        calls = self.reports.get(module)
        return calls[-1] if calls else None


class ReportsAttentionWeights:
    """Mixin of the plugin's attention modules: the weights-reporting contract above."""

    _weights_recorder: Optional[AttentionWeightsRecorder] = None

    @property
    def recording_weights(self) -> bool:
        return self.__dict__.get("_weights_recorder") is not None

    def report_weights(self, **report) -> None:
        """Report this forward's weights (keys and shapes above); a no-op unless recording."""
        recorder = self.__dict__.get("_weights_recorder")
        if recorder is None:
            return
        detach = lambda t: None if t is None else t.detach()  # noqa: E731
        recorder(self, {key: ({i: detach(w) for i, w in value.items()} if isinstance(value, dict) else detach(value))
                        for key, value in report.items()})


@contextlib.contextmanager
def record_attention_weights(modules, on_report=None):
    """Record the weights ``modules`` (attention modules of the plugin; others are skipped)
    report during the forwards run inside the block; yields the
    :class:`AttentionWeightsRecorder`."""
    recorder = AttentionWeightsRecorder(on_report)
    recording = [m for m in modules if isinstance(m, ReportsAttentionWeights)]
    for module in recording:
        module.__dict__["_weights_recorder"] = recorder
    try:
        yield recorder
    finally:
        for module in recording:
            module.__dict__.pop("_weights_recorder", None)


def head_weights_for_output(head_weights: Optional[Tensor], need_weights: bool,
                            need_head_weights: bool) -> Optional[Tensor]:
    """fairseq's H x B x Z x J per-head weights -> what the caller asked for: the same, their
    head average B x Z x J (as fairseq averages them), or None."""
    if head_weights is None or need_head_weights:
        return head_weights
    return head_weights.mean(dim=0) if need_weights else None


class RecordingMultiheadAttention(MultiheadAttention, ReportsAttentionWeights):
    """fairseq's MultiheadAttention, unchanged (same parameters and outputs), that reports
    its per-head weights while recording. torch's fused attention, which fairseq uses for
    full-sequence self-attention, returns head-averaged weights only; while recording the
    module runs fairseq's own (same) computation, which it does when it skips torch's
    embedding-dimension check."""

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        if not self.recording_weights or before_softmax:
            return super().forward(query, key, value, key_padding_mask, incremental_state, need_weights, static_kv,
                                   attn_mask, before_softmax, need_head_weights)
        skip = self.skip_embed_dim_check
        self.skip_embed_dim_check = True
        try:
            out, weights = super().forward(query, key, value, key_padding_mask, incremental_state, True, static_kv,
                                           attn_mask, False, True)  # H x B x Z x J
        finally:
            self.skip_embed_dim_check = skip
        self.report_weights(attention=weights.transpose(0, 1))
        return out, head_weights_for_output(weights, need_weights, need_head_weights)


def reporting_weights(module: MultiheadAttention) -> MultiheadAttention:
    """fairseq's MultiheadAttention as built by fairseq's own ``build_*_attention`` (with all
    of fairseq's options), made a :class:`RecordingMultiheadAttention`: the subclass adds no
    state and changes no output, so the module keeps everything fairseq gave it."""
    if type(module) is MultiheadAttention:
        module.__class__ = RecordingMultiheadAttention
    return module


def defer_reorder(buffer: Dict[str, Optional[Tensor]], new_order: Tensor) -> None:
    """Beam search's reorder of a self-attention cache, kept as an index (composed with one still
    pending) until the next step extends the cache: the steps are then copied once, reordered,
    instead of once by the reorder and again by the concatenation."""
    pending = buffer.get("new_order")
    buffer["new_order"] = new_order if pending is None else pending.index_select(0, new_order)


def _joined(prev: Tensor, new: Tensor, dim: int, order: Optional[Tensor]) -> Tensor:
    """torch.cat([prev.index_select(0, order), new], dim) for a cache on a CPU, where the copies' bytes are the
    cost: a reorder copies ``prev`` once, reordered; without one, ``prev`` is copied once into a tensor with
    room for as many steps again (``prev._base`` from then on), and each next step copies only itself there."""
    if prev.device.type != "cpu" or torch.is_grad_enabled() and (prev.requires_grad or new.requires_grad):
        return torch.cat([prev if order is None else prev.index_select(0, order), new], dim)
    length, total, room = prev.size(dim), prev.size(dim) + new.size(dim), prev._base
    if (order is not None or room is None or room.stride() != prev.stride() or room.data_ptr() != prev.data_ptr()
            or room.size(dim) < total or prev.shape != room.shape[:dim] + (length,) + room.shape[dim + 1:]):
        room = new.new_empty(new.shape[:dim] + (total if order is not None else 2 * total,) + new.shape[dim + 1:])
        start = room.narrow(dim, 0, length)
        start.copy_(prev) if order is None else torch.index_select(prev, 0, order, out=start)
    room.narrow(dim, length, new.size(dim)).copy_(new)
    return room.narrow(dim, 0, total)


def softmax_without_empty_rows(logits: Tensor, may_be_empty: bool = True) -> Tensor:
    """Softmax over the last dim, in fp32 at least (as fairseq does under fp16/bf16); a row
    whose logits are all -inf gets all-zero weights (``may_be_empty=False``: the caller knows
    there is none, and the plain softmax runs).

    Such rows occur when masking leaves a query nothing to attend to (a backward head on
    a left-padded position). Plain softmax gives NaN there, in the output and in the
    gradient; here the row is softmaxed as zeros and then zeroed, so both stay finite.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    if not may_be_empty:
        return torch.softmax(logits, dim=-1, dtype=dtype)  # the cast inside the softmax
    logits = logits.to(dtype)
    empty = torch.isneginf(logits).all(dim=-1, keepdim=True)
    probs = torch.softmax(logits.masked_fill(empty, 0.0), dim=-1)
    return probs.masked_fill(empty, 0.0)


def additive_mask(attn_mask: Tensor) -> Tensor:
    """fairseq passes attn_mask as additive floats (-inf / -1e8 = blocked); accept bool too."""
    if attn_mask.dtype == torch.bool:
        return torch.zeros(attn_mask.shape, device=attn_mask.device).masked_fill(attn_mask, float("-inf"))
    return attn_mask


def extend_cached_steps(saved: Dict[str, Optional[Tensor]], new: Dict[str, Tensor], key_padding_mask: Optional[Tensor],
                        order: Optional[Tensor] = None) -> Tuple[List[Tensor], Optional[Tensor]]:
    """Incremental self-attention: prepend the cached steps to the new ones and cache the
    result. ``new`` maps cache names to the new steps' tensors (B x H x T x D); each is
    concatenated after ``saved[name]`` (B' x H x S' x D), reordered by ``order`` (a reorder
    :func:`defer_reorder` kept; None = as they are), along the steps and stored back.
    The padding masks (B x S' cached, B x T new; None = no padding) are joined the same way
    under ``prev_key_padding_mask``. Returns the extended tensors, in ``new``'s order, and
    the extended mask."""
    extended = []
    for name, tensor in new.items():
        prev = saved.get(name)
        saved[name] = tensor if prev is None else _joined(prev, tensor, 2, order)
        extended.append(saved[name])
    reference = extended[0]
    bsz, total = reference.size(0), reference.size(2)
    new_len = next(iter(new.values())).size(2)
    prev_mask = saved.get("prev_key_padding_mask")
    if prev_mask is not None or key_padding_mask is not None:
        if prev_mask is None:
            prev_mask = torch.zeros(bsz, total - new_len, dtype=torch.bool, device=reference.device)
        elif order is not None:
            prev_mask = prev_mask.index_select(0, order)
        if key_padding_mask is None:
            key_padding_mask = torch.zeros(bsz, new_len, dtype=torch.bool, device=reference.device)
        key_padding_mask = torch.cat([prev_mask.to(torch.bool), key_padding_mask.to(torch.bool)], dim=1)
        saved["prev_key_padding_mask"] = key_padding_mask
    return extended, key_padding_mask


# ---- static keys/values shared by the hypotheses of a sentence ------------------------------
# Beam search decodes every sentence as `beam` hypotheses whose encoder states are copies
# (fairseq expands encoder_out with index_select), so the keys and values projected from
# them are copies too. The cross-attentions over n stacked sources project and cache them
# once per group of identical rows, and attend with the group's queries side by side: each
# step then reads n J d floats per sentence, not per hypothesis.


def identical_row_groups(memory: Tensor) -> int:
    """The largest g such that the N rows of ``memory`` (dim 1: J x N x ...) come in
    consecutive blocks of g identical rows: the beam size where decoding expanded each
    sentence into its hypotheses, 1 otherwise. Equal neighbouring sentences only merge
    runs, and g divides every run, so each block is always made of identical rows."""
    rows = memory.size(1)
    if rows < 2 or not torch.equal(memory[:, 0], memory[:, 1]):  # a first run of one row (greedy decoding)
        return 1
    same = (memory[:, 1:] == memory[:, :-1]).flatten(2).all(dim=2).all(dim=0)  # row i == row i + 1
    starts = torch.cat([torch.zeros(1, dtype=torch.long, device=memory.device),
                        torch.nonzero(~same).flatten() + 1,
                        torch.full((1,), rows, dtype=torch.long, device=memory.device)])
    group = 0
    for run in torch.diff(starts).tolist():
        group = math.gcd(group, run)
    return group


def group_queries(q: Tensor, groups: int) -> Tensor:
    """N x *M x Z x D -> G x *M x (g Z) x D: the queries of the g = N / G hypotheses that
    share one cached row of keys/values, side by side on the query axis (a no-op for g = 1)."""
    hypotheses = q.size(0)
    if hypotheses == groups:
        return q
    if hypotheses % groups:
        raise ValueError(f"{hypotheses} hypotheses cannot share {groups} cached rows of keys/values")
    return q.unflatten(0, (groups, hypotheses // groups)).movedim(1, -3).flatten(-3, -2)


def ungroup(x: Tensor, hypotheses: int) -> Tensor:
    """The inverse of ``group_queries``: G x *M x (g Z) x E -> N x *M x Z x E."""
    groups = x.size(0)
    if hypotheses == groups:
        return x
    return x.unflatten(-2, (hypotheses // groups, -1)).movedim(-3, 1).flatten(0, 1)


def group_mask(key_padding_mask: Optional[Tensor], groups: int) -> Optional[Tensor]:
    """One padding-mask row per group (N x ... -> G x ...): a group's rows are identical."""
    if key_padding_mask is None or key_padding_mask.size(0) == groups:
        return key_padding_mask
    return key_padding_mask[:: key_padding_mask.size(0) // groups]


def attend_by_sentence(attend, q: Tensor, rows: int, key_padding_mask: Optional[Tensor]) -> Tuple[Tensor, ...]:
    """``attend(queries, mask) -> (contexts, weights, ...)`` against keys/values cached in
    ``rows`` rows (one per sentence in decoding, see ``identical_row_groups``): the
    hypotheses' queries (N x *M x Z x D) grouped per row, the padding mask taken once per
    row, and every output returned per hypothesis (N x *M x Z x ...)."""
    outputs = attend(group_queries(q, rows), group_mask(key_padding_mask, rows))
    return tuple(ungroup(output, q.size(0)) for output in outputs)
