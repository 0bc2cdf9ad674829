"""Small pieces shared by the attention modules: projections, head reshaping, masks,
softmaxes, and the incremental-decoding cache helpers."""
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor


QKV_GAIN = 2 ** -0.5  # fairseq's scaled initialisation of the q/k/v projections


def xavier_linear(in_features: int, out_features: int, bias: bool = True, gain: float = 1.0):
    """A Linear initialised as fairseq's MultiheadAttention initialises its projections."""
    m = nn.Linear(in_features, out_features, bias=bias)
    nn.init.xavier_uniform_(m.weight, gain=gain)
    if bias:
        nn.init.constant_(m.bias, 0.0)
    return m


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
    logits = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    if key_padding_mask is not None:
        logits = logits.masked_fill(key_padding_mask[:, None, None, :].to(torch.bool), float("-inf"))
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


def reorder_buffer(buffer: Dict[str, Optional[Tensor]], new_order: Tensor) -> Dict[str, Optional[Tensor]]:
    """Reorder every batch-first cached tensor (beam search also shrinks the batch)."""
    return {k: (v.index_select(0, new_order) if v is not None else None) for k, v in buffer.items()}


def softmax_without_empty_rows(logits: Tensor) -> Tensor:
    """Softmax over the last dim, in fp32 at least (as fairseq does under fp16/bf16); a row
    whose logits are all -inf gets all-zero weights.

    Such rows occur when masking leaves a query nothing to attend to (a backward head on
    a left-padded position). Plain softmax gives NaN there, in the output and in the
    gradient; here the row is softmaxed as zeros and then zeroed, so both stay finite.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    empty = torch.isneginf(logits).all(dim=-1, keepdim=True)
    probs = torch.softmax(logits.masked_fill(empty, 0.0), dim=-1)
    return probs.masked_fill(empty, 0.0)


def additive_mask(attn_mask: Tensor) -> Tensor:
    """fairseq passes attn_mask as additive floats (-inf / -1e8 = blocked); accept bool too."""
    if attn_mask.dtype == torch.bool:
        return torch.zeros(attn_mask.shape, device=attn_mask.device).masked_fill(attn_mask, float("-inf"))
    return attn_mask


def extend_cached_steps(saved: Dict[str, Optional[Tensor]], new: Dict[str, Tensor],
                        key_padding_mask: Optional[Tensor]) -> Tuple[List[Tensor], Optional[Tensor]]:
    """Incremental self-attention: prepend the cached steps to the new ones and cache the
    result. ``new`` maps cache names to the new steps' tensors (B x H x T x D); each is
    concatenated after ``saved[name]`` (B x H x S' x D) along the steps and stored back.
    The padding masks (B x S' cached, B x T new; None = no padding) are joined the same way
    under ``prev_key_padding_mask``. Returns the extended tensors, in ``new``'s order, and
    the extended mask. Every tensor stays batch-first, so ``reorder_buffer`` applies."""
    extended = []
    for name, tensor in new.items():
        prev = saved.get(name)
        full = tensor if prev is None else torch.cat([prev, tensor], dim=2)
        saved[name] = full
        extended.append(full)
    reference = extended[0]
    bsz, total = reference.size(0), reference.size(2)
    new_len = next(iter(new.values())).size(2)
    prev_mask = saved.get("prev_key_padding_mask")
    if prev_mask is not None or key_padding_mask is not None:
        if prev_mask is None:
            prev_mask = torch.zeros(bsz, total - new_len, dtype=torch.bool, device=reference.device)
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
    if rows < 2:
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


def attend_by_sentence(attend, q: Tensor, rows: int, key_padding_mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    """``attend(queries, mask) -> (contexts, weights)`` against keys/values cached in
    ``rows`` rows (one per sentence in decoding, see ``identical_row_groups``): the
    hypotheses' queries (N x *M x Z x D) grouped per row, the padding mask taken once per
    row, and both outputs returned per hypothesis (N x *M x Z x ...)."""
    contexts, weights = attend(group_queries(q, rows), group_mask(key_padding_mask, rows))
    return ungroup(contexts, q.size(0)), ungroup(weights, q.size(0))
