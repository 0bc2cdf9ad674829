"""Mixed Multi-Head Self-Attention, MMA (Cui et al., 2019, "Mixed Multi-Head Self-Attention
for Neural Machine Translation", Sec. 3, Eq. 7-11).

Each head h gets a hard mask M^h added to its logits before the softmax (Eq. 7):

    G  global    M_ij = 0                                   (Eq. 8)
    L  local     M_ij = 0 if |i - j| <= w else -inf          (Eq. 9, default w = 1)
    F  forward   M_ij = 0 if j >= i else -inf                (Eq. 10)
    B  backward  M_ij = 0 if j <= i else -inf                (Eq. 11)

Projections are fairseq's own, so MMA adds no parameters and loads a standard
MultiheadAttention state dict as is.
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor

from fairseq_ext.errors import OptionError
from fairseq_ext.modules.attention_utils import (
    ReportsAttentionWeights,
    additive_mask,
    attention_weights_for_output,
    extend_cached_steps,
    merge_heads,
    softmax_without_empty_rows,
    split_heads,
)

MMA_HEAD_TYPES = ("G", "L", "F", "B")
_FUTURE_LOOKING = ("G", "F")
DECODER_DEFAULT_MMA_HEADS = "L,B"  # the causal heads, split evenly


def parse_mma_heads(spec: Optional[str], num_heads: int, causal: bool = False,
                    flag: Optional[str] = None) -> List[str]:
    """Expand a head spec (``--mma-heads``) to one letter per head.

    ``None``/``""`` is the paper's default split: the heads divided equally among G, L, F, B
    in that order (8 heads: G,G,L,L,F,F,B,B). A comma list of k letters with k dividing
    ``num_heads`` gives each letter num_heads / k consecutive heads (``G,L,L,L`` with 8
    heads: G,G,L,L,L,L,L,L). ``causal`` (decoder self-attention) forbids G and F heads, and
    its default is ``L,B``. ``flag`` is the option named in errors (default ``--mma-heads``,
    ``--decoder-mma-heads`` when causal).
    """
    flag = flag or ("--decoder-mma-heads" if causal else "--mma-heads")
    if causal and (spec is None or spec.strip() == ""):
        spec = DECODER_DEFAULT_MMA_HEADS
    if num_heads <= 0:
        raise OptionError(f"{flag}: the number of attention heads must be positive, got {num_heads}")
    if spec is None or spec.strip() == "":
        if num_heads % len(MMA_HEAD_TYPES) != 0:
            raise OptionError(
                f"{flag}: the default split divides the heads equally among G,L,F,B, "
                f"but {num_heads} heads are not divisible by 4; give an explicit {flag}"
            )
        letters = list(MMA_HEAD_TYPES)
    else:
        letters = [s.strip().upper() for s in spec.split(",")]
        unknown = [s for s in letters if s not in MMA_HEAD_TYPES]
        if unknown:
            raise OptionError(
                f"{flag} {spec!r}: unknown head type(s) {unknown}; "
                f"use a comma list of {', '.join(MMA_HEAD_TYPES)} (global, local, forward, backward)"
            )
        if len(letters) > num_heads or num_heads % len(letters) != 0:
            raise OptionError(
                f"{flag} {spec!r}: {len(letters)} entries do not divide the "
                f"{num_heads} attention heads; give {num_heads} letters or a divisor of {num_heads}"
            )
    heads = [letter for letter in letters for _ in range(num_heads // len(letters))]
    return check_head_types(heads, num_heads, causal, what=f"{flag} {spec!r}")


def check_head_types(heads: Sequence[str], num_heads: int, causal: bool, what: str = "--mma-heads") -> List[str]:
    """One letter per head, each one of G, L, F, B; no G or F head in a causal
    (decoder) self-attention. Returns the letters as a list."""
    heads = list(heads)
    if len(heads) != num_heads or any(h not in MMA_HEAD_TYPES for h in heads):
        raise OptionError(f"{what}: expected one of {', '.join(MMA_HEAD_TYPES)} for each of the {num_heads} heads, "
                          f"got {','.join(heads)}")
    if causal:
        bad = sorted({h for h in heads if h in _FUTURE_LOOKING})
        if bad:
            raise OptionError(
                f"{what} has {'/'.join(bad)} head(s), which attend to future "
                f"positions; decoder self-attention must be causal, so only L (local, past "
                f"side) and B (backward) heads are allowed there"
            )
    return heads


def mma_head_masks(
    heads: Sequence[str], tgt_len: int, src_len: int, window: int, causal: bool, device=None
) -> Tensor:
    """H x T x S bool, True where head h's query i may attend to key j.

    Queries are the last ``tgt_len`` of the ``src_len`` positions (in incremental
    decoding the keys also hold the cached past). In the causal case the local window
    keeps only its past side, so every mask is causal on its own.
    """
    i = torch.arange(src_len - tgt_len, src_len, device=device).unsqueeze(1)  # T x 1
    j = torch.arange(src_len, device=device).unsqueeze(0)  # 1 x S
    local = (i - j).abs() <= window
    by_type = {
        "G": torch.ones(tgt_len, src_len, dtype=torch.bool, device=device),
        "L": local & (j <= i) if causal else local,
        "F": j >= i,
        "B": j <= i,
    }
    return torch.stack([by_type[h].expand(tgt_len, src_len) for h in heads])


class MixedMultiheadAttention(MultiheadAttention, ReportsAttentionWeights):
    """Mixed Multi-Head Self-Attention (Cui et al., 2019, Eq. 7-11): fairseq's
    MultiheadAttention with a hard G/L/F/B mask per head added before the softmax.

    Same parameters as MultiheadAttention (q/k/v/out projections), so zero extra
    parameters and interchangeable state dicts; with every head ``G`` it computes exactly
    fairseq's attention.

    Args:
        head_spec: ``--mma-heads`` string, or a list of letters (expanded like the string);
            None = the paper's default equal split over G, L, F, B.
        window: w of the local heads (|i - j| <= w).
        causal: decoder self-attention; only L/B heads allowed, incremental decoding
            supported.
        other arguments: as MultiheadAttention (``add_bias_kv``, ``add_zero_attn`` and
            xformers are not supported).
    """

    def __init__(self, embed_dim: int, num_heads: int, head_spec: Union[None, str, Sequence[str]] = None,
                 window: int = 1, causal: bool = False, **kwargs):
        if kwargs.get("add_bias_kv") or kwargs.get("add_zero_attn"):
            raise ValueError("MixedMultiheadAttention does not support add_bias_kv / add_zero_attn")
        if kwargs.get("xformers_att_config") is not None:
            raise ValueError("MixedMultiheadAttention does not support xformers attention")
        if kwargs.get("encoder_decoder_attention"):
            raise ValueError("MixedMultiheadAttention is a self-attention (its masks compare positions)")
        super().__init__(embed_dim, num_heads, **kwargs)
        if window < 0:
            raise ValueError(f"--mma-window must be >= 0, got {window}")
        if head_spec is None or isinstance(head_spec, str):  # a spec such as "G,L,F,B"
            self.head_types: List[str] = parse_mma_heads(head_spec, num_heads, causal)
        else:  # one letter per head, as the model's parsed options hold them
            self.head_types = check_head_types(head_spec, num_heads, causal)
        self.window = window
        self.causal = causal
        self._blocked: Optional[Tensor] = None  # H x N x N, every head's blocked pairs (not a buffer: not saved)

    def blocked_pairs(self, tgt_len: int, src_len: int, device) -> Tensor:
        """H x T x S bool, True where a head may not attend: a view of one H x N x N table per module,
        made again only for a longer sequence (N: the next power of two) or another device, so that
        a step launches no operator for the masks (a mask depends on the positions alone)."""
        table = self._blocked
        if table is None or table.size(-1) < src_len or table.device != device:
            n = max(64, 1 << (src_len - 1).bit_length())
            table = self._blocked = ~mma_head_masks(self.head_types, n, n, self.window, self.causal, device)
        return table[:, src_len - tgt_len:src_len, :src_len]

    def extra_repr(self) -> str:
        return f"heads={','.join(self.head_types)}, window={self.window}, causal={self.causal}"

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None, incremental_state: Optional[Dict[str, Dict]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """query/key/value: T x B x C (self-attention: key = value = query, or None);
        key_padding_mask: B x T bool, True = pad; attn_mask: T x S additive float (or bool,
        True = blocked), added on top of the head masks.

        Returns the output T x B x C and the attention weights: H x B x T x S per head
        with ``need_head_weights``, B x T x S averaged over heads with ``need_weights``,
        else None. In incremental mode (causal only) T = the new steps, S = all steps so far.
        """
        if static_kv or before_softmax:
            raise NotImplementedError("MixedMultiheadAttention: static_kv / before_softmax")
        if incremental_state is not None and not self.causal:
            raise ValueError("MixedMultiheadAttention: incremental decoding needs causal=True")
        key = query if key is None else key
        value = key if value is None else value
        tgt_len = query.size(0)

        q = split_heads(self.q_proj(query) * self.scaling, self.num_heads)  # B x H x T x D
        k = split_heads(self.k_proj(key), self.num_heads)
        v = split_heads(self.v_proj(value), self.num_heads)
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            (k, v), key_padding_mask = extend_cached_steps(saved, {"prev_key": k, "prev_value": v}, key_padding_mask)
            self._set_input_buffer(incremental_state, saved)
        src_len = k.size(2)

        logits = torch.matmul(q, k.transpose(-1, -2))  # B x H x T x S
        if attn_mask is not None:
            logits = logits + additive_mask(attn_mask)
        blocked = self.blocked_pairs(tgt_len, src_len, query.device).unsqueeze(0)  # 1 x H x T x S
        if key_padding_mask is not None:
            blocked = blocked | key_padding_mask.to(torch.bool)[:, None, None, :]
        # every head lets a query attend to its own position: a row can be empty only under a mask from outside
        may_be_empty = key_padding_mask is not None or attn_mask is not None
        weights = softmax_without_empty_rows(logits.masked_fill(blocked, float("-inf")), may_be_empty)
        out = torch.matmul(self.dropout_module(weights.type_as(logits)), v)  # B x H x T x D
        out = self.out_proj(merge_heads(out))  # T x B x C
        self.report_weights(attention=weights)
        return out, attention_weights_for_output(weights, need_weights, need_head_weights)
