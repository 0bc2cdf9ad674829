"""Every ``--joint-attention`` strategy in one table: what the encoder builds as the
decoder's source memory, which cross-attention each main-decoder layer uses, and the
strategy's constraints. The math of each strategy is in ``fairseq_ext/modules/``.

Adding a strategy means one module in ``fairseq_ext/modules/`` and one entry in
:data:`STRATEGIES`: the option's choices, its validation, the encoder's memory, the decoder
layer's cross-attention and the multi-source check all read this table.

The memory kind of an entry (:class:`Memory`) is what ``encoder_out["joint_memory"]`` holds.
"""
import enum
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch.nn as nn

from fairseq_ext.modules.layer_aggregation import LayerAggregation
from fairseq_ext.modules.multi_layer_multihead_attention import MultiLayerMultiheadAttention
from fairseq_ext.modules.multi_source_attention import (
    FlatCrossAttention,
    HierarchicalCrossAttention,
    ParallelCrossAttention,
    SourceSelectAttention,
)
from fairseq_ext.modules.transparent_attention import TransparentCombination


class Memory(enum.Enum):
    """What the encoder hands the decoder besides its top layer."""

    NONE = "none"  # no joint memory: the decoder reads the top layer (the stock Transformer)
    AGGREGATED = "aggregated"  # one state per source position, H^a (J x B x C): layer aggregation
    PER_DECODER_LAYER = "per_decoder_layer"  # one memory per decoder layer (J x B x M x C): transparent
    STACKED = "stacked"  # the n collected layers f^1..f^n stacked (J x B x n x C): MLMHA, multi-source


@dataclass(frozen=True)
class CrossAttentionSpec:
    """What a decoder layer knows when it builds its cross-attention."""

    embed_dim: int
    num_heads: int
    num_sources: int  # n
    dropout: float
    layer_number: int  # 1-based decoder layer
    kdim: int
    q_noise: float = 0.0
    qn_block_size: int = 8
    removed_source: Optional[int] = None  # 0-based: layer masking (--mask-source-layer)


@dataclass(frozen=True)
class MemorySpec:
    """What the encoder knows when it builds its memory module."""

    embed_dim: int
    ffn_dim: int
    num_sources: int  # n
    activation_dropout: float
    num_encoder_layers: int
    num_decoder_layers: int
    merger_dropout: float = 0.0  # transparent attention: dropout on the mixing weights before their softmax


@dataclass(frozen=True)
class JointAttentionStrategy:
    name: str
    memory: Memory
    # encoder side: the module that turns the encoder layers into the memory, and its
    # attribute name on the encoder (part of the checkpoint's parameter names)
    build_memory: Optional[Callable[[MemorySpec], nn.Module]] = None
    memory_attribute: Optional[str] = None
    # decoder side: each main-decoder layer's cross-attention (None: fairseq's own)
    build_cross_attention: Optional[Callable[[CrossAttentionSpec], nn.Module]] = None
    # the n-1 lower serial cross-attention sublayers, run right after self-attention
    # (fairseq_ext/modules/post_self_attention.py)
    serial_sublayers: bool = False
    # reads the top n layers (--joint-attention-layers); transparent reads all L+1 states
    collects_layers: bool = True
    # can combine different source sentences (task multi_source_translation)
    multi_source: bool = False


def _mlmha(layer_specific: bool, sum_contexts: bool):
    def build(spec: CrossAttentionSpec):
        return MultiLayerMultiheadAttention(spec.embed_dim, spec.num_heads, spec.num_sources,
                                            layer_specific=layer_specific, sum_contexts=sum_contexts,
                                            dropout=spec.dropout, removed_source=spec.removed_source)
    return build


def _source_select(index: Callable[[CrossAttentionSpec], int], one_of_n_sources: bool):
    """fairseq's cross-attention reading one slice of a stacked memory (``one_of_n_sources``:
    the slice is one source of a combination, not a memory of its own)."""
    def build(spec: CrossAttentionSpec):
        return SourceSelectAttention(spec.embed_dim, spec.num_heads, kdim=spec.kdim, vdim=spec.kdim,
                                     dropout=spec.dropout, encoder_decoder_attention=True, q_noise=spec.q_noise,
                                     qn_block_size=spec.qn_block_size, source_index=index(spec),
                                     removed=spec.removed_source is not None and spec.removed_source == index(spec),
                                     one_of_n_sources=one_of_n_sources)
    return build


def _aggregation(name: str, concatenation: bool, iterative: bool) -> JointAttentionStrategy:
    def build(spec: MemorySpec):
        return LayerAggregation(spec.embed_dim, spec.ffn_dim, spec.num_sources, concatenation=concatenation,
                                iterative=iterative, activation_dropout=spec.activation_dropout)
    return JointAttentionStrategy(name, Memory.AGGREGATED, build_memory=build, memory_attribute="layer_aggregation")


def _stacked(name: str, build, multi_source: bool, **kwargs) -> JointAttentionStrategy:
    return JointAttentionStrategy(name, Memory.STACKED, build_cross_attention=build, multi_source=multi_source,
                                  **kwargs)


STRATEGIES: Dict[str, JointAttentionStrategy] = {s.name: s for s in [
    # the top encoder layer only (the stock Transformer)
    JointAttentionStrategy("none", Memory.NONE, collects_layers=False),
    # layer aggregation (thesis 3.2.1): weighted sum of the n layers (Eq. 3.2), iterative
    # weighted sums bottom to top (Eq. 3.3), concatenation + FFN (Eq. 3.4), iterative
    # concatenation (Eq. 3.5)
    _aggregation("s-agg", concatenation=False, iterative=False),
    _aggregation("iter-s-agg", concatenation=False, iterative=True),
    _aggregation("c-agg", concatenation=True, iterative=False),
    _aggregation("iter-c-agg", concatenation=True, iterative=True),
    # transparent attention, one learned mix of all L+1 states per decoder layer (Bapna et al. 2018)
    JointAttentionStrategy(
        "transparent", Memory.PER_DECODER_LAYER,
        build_memory=lambda spec: TransparentCombination(spec.num_encoder_layers + 1, spec.num_decoder_layers,
                                                         spec.merger_dropout),
        memory_attribute="transparent",
        build_cross_attention=_source_select(lambda spec: spec.layer_number - 1, one_of_n_sources=False),
        collects_layers=False),
    # MLMHA (thesis Eq. 3.6-3.11), (U0, U1): one softmax over the summed per-layer logits (U0=0)
    # or a softmax per layer (U0=1); contexts concatenated (U1=0) or summed (U1=1)
    _stacked("m-00", _mlmha(layer_specific=False, sum_contexts=False), multi_source=False),
    _stacked("m-01", _mlmha(layer_specific=False, sum_contexts=True), multi_source=False),
    _stacked("m-10", _mlmha(layer_specific=True, sum_contexts=False), multi_source=True),
    _stacked("m-11", _mlmha(layer_specific=True, sum_contexts=True), multi_source=True),
    # Libovicky et al. 2018: one cross-attention sublayer per layer, f^1 first (Fig. 1a)
    _stacked("serial", _source_select(lambda spec: spec.num_sources - 1, one_of_n_sources=True), multi_source=True,
             serial_sublayers=True),
    # the sum of n independent cross-attentions (Eq. 4)
    _stacked("parallel",
             lambda spec: ParallelCrossAttention(spec.embed_dim, spec.num_heads, spec.num_sources, spec.dropout,
                                                 removed_source=spec.removed_source),
             multi_source=True),
    # one attention over all layers' states (Eq. 5-6)
    _stacked("flat",
             lambda spec: FlatCrossAttention(spec.embed_dim, spec.num_heads, spec.num_sources, spec.dropout,
                                             removed_source=spec.removed_source),
             multi_source=True),
    # per-layer multi-head attentions, then a multi-head attention over their contexts (Eq. 7-8)
    _stacked("hierarchical",
             lambda spec: HierarchicalCrossAttention(spec.embed_dim, spec.num_heads, spec.num_sources, spec.dropout,
                                                     kdim=spec.kdim, removed_source=spec.removed_source),
             multi_source=True),
]}

STRATEGY_NAMES: List[str] = list(STRATEGIES)
MULTI_SOURCE_STRATEGY_NAMES: List[str] = [name for name, s in STRATEGIES.items() if s.multi_source]
