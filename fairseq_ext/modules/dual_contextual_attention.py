"""Dual Contextual module, DC (Ampomah, thesis Ch. 5, Sec. 5.3, Eq. 5.4-5.7).

Replaces a layer's self-attention. With input r (the previous layer's output):

    r_hat = GLU(Conv1d_{d -> 2d, kernel f}(r))                      Local Context Unit (5.4)
    lc    = LayerNorm(r_hat + r)
    h_l   = FI(r, lc),  h_g = FI(r, r)                              Context Interaction (5.5)
    FI(A, B) = concat_h softmax((A W^q_h)(B W^k_h)^T / sqrt(d_k)) (B W^v_h)   (no W^o)
    z_hat = [h_l ; h_g] W_z + b_z,  W_z in R^{2d x d}                (5.6)
    z     = LayerNorm(z_hat + r)                                     (5.7)

The module returns z_hat; fairseq's Transformer layer applies the dropout, residual and
self_attn_layer_norm around it, which is Eq. 5.7.
"""
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor

from fairseq_ext.modules.attention_utils import (
    ReportsAttentionWeights,
    additive_mask,
    attention_weights_for_output,
    defer_reorder,
    extend_cached_steps,
    made_while_unchanged,
    merge_heads,
    softmax_without_empty_rows,
    split_heads,
    xavier_linear,
)


def _is_same_tensor(other: Optional[Tensor], query: Tensor) -> bool:
    """None, or the same storage viewed the same way (x[t:t+1] passed three times counts)."""
    return other is None or other is query or (
        other.data_ptr() == query.data_ptr() and other.shape == query.shape and other.stride() == query.stride()
    )


class FeatureInteraction(nn.Module):
    """FI(A, B) of thesis Eq. 5.5: multi-head attention of queries A W^q over keys B W^k and
    values B W^v, heads concatenated, without an output projection (3 d^2 weights). The module
    holds the weights; :class:`DualContextualAttention` runs its two FIs as one attention."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by the attention heads ({num_heads})")
        gain = 2**-0.5  # as fairseq's MultiheadAttention initialises q/k/v
        self.q_proj = xavier_linear(embed_dim, embed_dim, gain=gain)
        self.k_proj = xavier_linear(embed_dim, embed_dim, gain=gain)
        self.v_proj = xavier_linear(embed_dim, embed_dim, gain=gain)


@with_incremental_state
class DualContextualAttention(nn.Module, ReportsAttentionWeights):
    """Dual Contextual module (Ampomah, thesis Ch. 5, Eq. 5.4-5.6), a drop-in replacement for
    fairseq's self-attention ``MultiheadAttention`` inside a Transformer layer.

    Local Context Unit (Eq. 5.4): Conv1d(d -> 2d, kernel f) + GLU, LayerNorm(r_hat + r). Padded
    positions of r are zeroed before the convolution, so a padded batch computes what each
    sentence computes alone. Encoder: pad (f-1)//2 left and f//2 right; decoder (``causal``):
    pad f-1 left, and incremental decoding keeps the last f-1 inputs.
    Context Interaction Unit (Eq. 5.5-5.6): h_l = FI(r, lc), h_g = FI(r, r), z_hat =
    [h_l; h_g] W_z + b_z. Parameters: 2 f d^2 (conv) + 2 * 3 d^2 (FI) + 2 d^2 (W_z) weights,
    i.e. (4 + 2f) d^2 more than MultiheadAttention's 4 d^2.
    """

    def __init__(self, embed_dim: int, num_heads: int, kernel_size: int = 3, attention_dropout: float = 0.0,
                 causal: bool = False):
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"--dc-kernel-size must be >= 1, got {kernel_size}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.kernel_size = kernel_size
        self.causal = causal
        # (left, right) zero padding of the convolution input.
        self.conv_padding = (kernel_size - 1, 0) if causal else ((kernel_size - 1) // 2, kernel_size // 2)

        self.conv = nn.Conv1d(embed_dim, 2 * embed_dim, kernel_size)  # W^r, b^r of Eq. 5.4
        nn.init.xavier_uniform_(self.conv.weight)
        nn.init.constant_(self.conv.bias, 0.0)
        self.lc_layer_norm = LayerNorm(embed_dim)
        self.local_fi = FeatureInteraction(embed_dim, num_heads)  # h_l = FI(r, lc)
        self.global_fi = FeatureInteraction(embed_dim, num_heads)  # h_g = FI(r, r)
        self.out_proj = xavier_linear(2 * embed_dim, embed_dim)  # W_z, b_z of Eq. 5.6
        self.dropout_module = FairseqDropout(attention_dropout, module_name=self.__class__.__name__)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, causal={self.causal}"

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None, incremental_state: Optional[Dict[str, Dict]] = None,
                need_weights: bool = False, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """query: r, T x B x C (key/value must be r itself or None: DC is a self-attention);
        key_padding_mask: B x T bool, True = pad; attn_mask: T x S additive float (fairseq's
        future mask) or bool, added to both FIs' logits. With ``causal`` both FIs are also
        masked causally by the module itself.

        Returns z_hat (T x B x C) and the weights of the global FI h_g: H x B x T x S with
        ``need_head_weights``, B x T x S head-averaged with ``need_weights``, else None.
        Incremental mode (causal only): T = the new steps, S = all steps so far.
        """
        if not (_is_same_tensor(key, query) and _is_same_tensor(value, query)):
            raise ValueError("DualContextualAttention is a self-attention: key/value must be the query")
        if static_kv or before_softmax:
            raise NotImplementedError("DualContextualAttention: static_kv / before_softmax")
        if incremental_state is not None and not self.causal:
            raise ValueError("DualContextualAttention: incremental decoding needs causal=True")
        r = query
        tgt_len = r.size(0)
        pad = key_padding_mask.to(torch.bool) if key_padding_mask is not None else None
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        order = saved.pop("new_order", None) if saved is not None else None  # beam search's, kept till now

        lc = self._local_context(r, pad, saved, order)  # T x B x C
        # the two FIs as one attention of 2H heads (local, then global): one matmul projects
        # [q_l; q_g; k_g; v_g] from r, one [k_l; v_l] from lc, and one cache holds both FIs' steps
        heads = self.num_heads
        w_r, b_r, w_lc, b_lc = self._projections()
        from_r = split_heads(F.linear(r, w_r, b_r), 4 * heads)
        from_lc = split_heads(F.linear(lc, w_lc, b_lc), 2 * heads)
        q = from_r[:, : 2 * heads]
        k = torch.cat([from_lc[:, :heads], from_r[:, 2 * heads : 3 * heads]], dim=1)
        v = torch.cat([from_lc[:, heads:], from_r[:, 3 * heads :]], dim=1)
        if saved is not None:
            (k, v), pad = extend_cached_steps(saved, {"prev_key": k, "prev_value": v}, pad, order)
            self._set_input_buffer(incremental_state, saved)
        src_len = k.size(2)

        blocked = pad[:, None, None, :] if pad is not None else None  # B x 1 x 1 x S
        if self.causal and tgt_len > 1:  # (one new step sees every cached one)
            i = torch.arange(src_len - tgt_len, src_len, device=r.device).unsqueeze(1)
            future = torch.arange(src_len, device=r.device).unsqueeze(0) > i  # T x S
            blocked = future if blocked is None else blocked | future
        logits = torch.matmul(q, k.transpose(-1, -2))  # B x 2H x T x S
        if attn_mask is not None:
            logits = logits + additive_mask(attn_mask)
        if blocked is not None:
            logits = logits.masked_fill(blocked, float("-inf"))
        weights = softmax_without_empty_rows(logits, may_be_empty=blocked is not None)  # nothing masked: none empty
        h = torch.matmul(self.dropout_module(weights.type_as(q)), v)
        self.report_weights(attention=weights[:, heads:], local=weights[:, :heads])
        z_hat = self.out_proj(merge_heads(h))  # [h_l; h_g] W_z + b_z
        return z_hat, attention_weights_for_output(weights[:, heads:], need_weights, need_head_weights)

    def _projections(self) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Weights and biases of [q_l; q_g; k_g; v_g] (queries pre-scaled by 1 / sqrt(d_k)) and of
        [k_l; v_l], concatenated once while the weights do not change (decoding)."""
        local, glob, scaling = self.local_fi, self.global_fi, self.head_dim**-0.5
        parts = [local.q_proj, glob.q_proj, glob.k_proj, glob.v_proj, local.k_proj, local.v_proj]
        params = [t for m in parts for t in (m.weight, m.bias)]

        def fuse(ts):
            w, b = list(ts[0::2]), list(ts[1::2])
            w[:2], b[:2] = [t * scaling for t in w[:2]], [t * scaling for t in b[:2]]  # the two queries
            return torch.cat(w[:4]), torch.cat(b[:4]), torch.cat(w[4:]), torch.cat(b[4:])

        return made_while_unchanged(self, "_fused_projections", params, fuse)

    def _local_context(self, r: Tensor, pad: Optional[Tensor], saved: Optional[Dict[str, Optional[Tensor]]],
                       order: Optional[Tensor] = None):
        """Eq. 5.4: lc = LayerNorm(GLU(conv(r)) + r), T x B x C. In incremental mode the
        convolution sees the cached last f-1 inputs (B x (f-1) x C) instead of zero padding."""
        conv_in = r if pad is None else r.masked_fill(pad.t().unsqueeze(-1), 0.0)
        conv_in = conv_in.permute(1, 2, 0)  # B x C x T
        if saved is None:
            conv_in = F.pad(conv_in, self.conv_padding)
        else:
            history = saved.get("prev_conv_input")  # B x C x (f-1)
            if history is None:
                history = conv_in.new_zeros(conv_in.size(0), conv_in.size(1), self.kernel_size - 1)
            elif order is not None:
                history = history.index_select(0, order)
            conv_in = torch.cat([history, conv_in], dim=2)
            saved["prev_conv_input"] = conv_in[:, :, conv_in.size(2) - (self.kernel_size - 1) :]
        if conv_in.size(2) == self.kernel_size:  # one output step (decoding): the conv is one matmul
            # (C x f inputs -> 2C), much cheaper than a convolution call on a length-f input
            weight = self.conv.weight.reshape(self.conv.out_channels, -1)
            conv_out = F.linear(conv_in.reshape(conv_in.size(0), -1), weight, self.conv.bias).unsqueeze(2)
        else:
            conv_out = self.conv(conv_in)
        r_hat = F.glu(conv_out, dim=1).permute(2, 0, 1)  # T x B x C
        return self.lc_layer_norm(r_hat + r)

    def reorder_incremental_state(self, incremental_state: Dict[str, Dict], new_order: Tensor):
        """Beam search: select (and possibly shrink) the batch of every cached tensor, when the
        next step extends them (:func:`defer_reorder`)."""
        saved = self._get_input_buffer(incremental_state)
        if saved:
            defer_reorder(saved, new_order)  # in place: the dict incremental_state holds
        return incremental_state

    def _get_input_buffer(self, incremental_state: Optional[Dict[str, Dict]]) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "dc_state")
        return result if result is not None else {}

    def _set_input_buffer(self, incremental_state: Optional[Dict[str, Dict]], buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "dc_state", buffer)
