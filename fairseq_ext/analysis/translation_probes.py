"""The probes of the word-translation analysis (Xu et al. 2020, Sec. 2-3) and what they read of
the frozen model: the merged alignment (Eq. 1-3), a layer's trained projection into the
model's classifier, every encoder and decoder layer's output (a decoder sublayer bypassed
where asked), and the cross-attention that aligns the encoder layers to the target."""
import contextlib
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn as nn

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.analysis.capture import capture_cross_attention
from fairseq_ext.analysis.encoder_features import layer_outputs, primary_encoder

PARTS = ("encoder", "decoder", "self", "cross")
SUBLAYER = {"self": "self_attn", "cross": "encoder_attn"}
NO_CROSS_ATTENTION = "the decoder has no cross-attention: encoder layers cannot be aligned (--parts)"


def merged_alignment(attentions: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Eq. 1-2: A = sum_i softmax(w)_i A_i. ``attentions`` B x K x T x S (K = decoder
    layers x heads, layer-major), ``w`` K; returns B x T x S."""
    p = torch.softmax(w.float(), dim=0)
    return torch.einsum("k,bkts->bts", p, attentions.float())


def target_side(alignment: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Eq. 3: T_E = A^T x E (A source x target) = alignment (B x T x S) @ states (B x S x C)."""
    return torch.bmm(alignment, states.float())


class LayerProbe(nn.Module):
    """The trained part of one analysed layer: a linear projection without bias into the
    classifier's input space (identity at the start when square), and, for an encoder
    layer, the alignment weights w (one per decoder layer x head, zero: uniform p)."""

    def __init__(self, dim_in: int, dim_out: int, alignment_size: Optional[int] = None):
        super().__init__()
        self.projection = nn.Linear(dim_in, dim_out, bias=False)
        if dim_in == dim_out:
            nn.init.eye_(self.projection.weight)
        else:
            nn.init.xavier_uniform_(self.projection.weight)
        self.w = nn.Parameter(torch.zeros(alignment_size)) if alignment_size else None

    def forward(self, features: torch.Tensor, attentions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """B x T x C (decoder) or B x S x C with B x K x T x S attentions (encoder) -> B x T x C'."""
        if self.w is not None:
            features = target_side(merged_alignment(attentions, self.w), features)
        return self.projection(features)


class _Stop(Exception):
    pass


def decoder_layers(model):
    layers = getattr(model.decoder, "layers", None)
    if layers is None:
        raise AnalysisError("the model's decoder has no layers to analyse")
    return layers


def classifier_input(decoder, state: torch.Tensor) -> torch.Tensor:
    """A decoder layer's output (T x B x C) as the decoder hands its last one to the
    classifier: final LayerNorm (pre-norm), B x T x C, project_out_dim."""
    if getattr(decoder, "layer_norm", None) is not None:
        state = decoder.layer_norm(state)
    state = state.transpose(0, 1)
    if getattr(decoder, "project_out_dim", None) is not None:
        state = decoder.project_out_dim(state)
    return state


@contextlib.contextmanager
def bypass(layer, sublayer: str):
    """Inside: ``layer``'s ``sublayer`` ("self_attn" | "encoder_attn") outputs zeros, so the
    layer keeps only the residual path around it."""
    def zero(module, args, output):
        return (torch.zeros_like(output[0]),) + tuple(output[1:])

    handle = getattr(layer, sublayer).register_forward_hook(zero)
    try:
        yield
    finally:
        handle.remove()


def layer_output(model, layer_index: int, prev_output_tokens, encoder_out, sublayer: Optional[str] = None):
    """Decoder layer ``layer_index`` (0-based)'s output, T x B x C, from the model's own
    forward (stopped there), with ``sublayer`` bypassed if given."""
    layer = decoder_layers(model)[layer_index]
    captured = {}

    def stop(module, args, output):
        captured["x"] = output[0]
        raise _Stop

    handle = layer.register_forward_hook(stop)
    try:
        with bypass(layer, sublayer) if sublayer else contextlib.nullcontext():
            model.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=True)
    except _Stop:
        pass
    finally:
        handle.remove()
    return captured["x"]


def probe_names(num_encoder_layers: int, num_decoder_layers: int, parts: Sequence[str]) -> List[str]:
    names = []
    if "encoder" in parts:
        names += [f"enc{l}" for l in range(num_encoder_layers + 1)]
    if "decoder" in parts:
        names += [f"dec{l}" for l in range(num_decoder_layers + 1)]
    for part in ("self", "cross"):
        if part in parts:
            names += [f"dec{l}-{part}" for l in range(1, num_decoder_layers + 1)]
    return names


@torch.no_grad()
def frozen_features(model, sample, names: Sequence[str]) -> Dict[str, object]:
    """What the probes read for one batch: ``enc<l>`` -> B x S x C, ``attn`` -> B x K x T x S,
    ``dec<l>[-self|-cross]`` -> B x T x C, and ``model`` -> the model's own logits input."""
    net = {k: v for k, v in sample["net_input"].items() if k != "prev_output_tokens"}
    prev = sample["net_input"]["prev_output_tokens"]
    encoder_out = model.encoder(**net, return_all_hiddens=True)
    want_enc = any(n.startswith("enc") for n in names)
    out: Dict[str, object] = {}
    with capture_cross_attention(model, missing=NO_CROSS_ATTENTION) if want_enc else contextlib.nullcontext() \
            as records:
        x, extra = model.decoder(prev, encoder_out=encoder_out, features_only=True)
    out["model"] = x
    if want_enc:
        if hasattr(model.encoder, "encoder_for"):
            raise AnalysisError("--parts encoder: a multi-source model's cross-attention reads several sources; "
                                "analyse its decoder layers (--parts decoder self cross)")
        states = layer_outputs(primary_encoder(model), encoder_out)
        attn = torch.cat([records[i]["attention"] for i in sorted(records)], dim=1)  # B x (M H) x T x S, layer-major
        if attn.size(-1) != states[0].size(0):
            raise AnalysisError("--parts encoder: the cross-attention is not over the source positions "
                                f"({attn.size(-1)} keys for {states[0].size(0)} source tokens)")
        out["attn"] = attn
        for l, s in enumerate(states):
            if f"enc{l}" in names:
                out[f"enc{l}"] = s.transpose(0, 1)
    inner = extra["inner_states"]
    for l, s in enumerate(inner):
        if f"dec{l}" in names:
            out[f"dec{l}"] = classifier_input(model.decoder, s)
    for part, sublayer in SUBLAYER.items():
        for l in range(1, len(inner)):
            if f"dec{l}-{part}" in names:
                h = layer_output(model, l - 1, prev, encoder_out, sublayer)
                out[f"dec{l}-{part}"] = classifier_input(model.decoder, h)
    return out


def probe_logits(model, probe: LayerProbe, name: str, features: Dict[str, object]) -> torch.Tensor:
    if name.startswith("enc"):
        return model.decoder.output_layer(probe(features[name], features["attn"]))
    return model.decoder.output_layer(probe(features[name]))


def build_probes(model, names: Sequence[str]) -> nn.ModuleDict:
    encoder, decoder = primary_encoder(model), model.decoder
    dim_out = decoder.output_embed_dim
    heads = sum(getattr(layer.encoder_attn, "num_heads", 0) for layer in decoder_layers(model)
                if getattr(layer, "encoder_attn", None) is not None)
    probes = nn.ModuleDict()
    for name in names:
        if name.startswith("enc"):
            probes[name] = LayerProbe(encoder.embed_tokens.embedding_dim, dim_out, alignment_size=heads)
        else:
            probes[name] = LayerProbe(dim_out, dim_out)
    dev = next(model.parameters()).device
    return probes.to(dev)
