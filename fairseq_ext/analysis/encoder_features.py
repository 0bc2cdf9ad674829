"""What the frozen encoder gives a probe: the output of each of its layers (H^0 the embeddings
to H^L, each as the top layer is handed on), and a sentence's mean over its positions."""
from typing import Dict, List, Sequence

import torch
from fairseq.data import data_utils

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.common.data_text import TextPipeline

def primary_encoder(model):
    """The encoder of the (first) source sentence."""
    encoder = model.encoder
    return encoder.encoder_for(0) if hasattr(encoder, "encoder_for") else encoder


def layer_outputs(encoder, encoder_out) -> List[torch.Tensor]:
    """[H^0 (embeddings), H^1, ..., H^L], T x B x C each, every one as the top layer is handed
    on: through the encoder's final LayerNorm when it has one (pre-norm), so H^L is
    ``encoder_out``."""
    states = list(encoder_out.get("encoder_states") or [])
    if not states:
        raise AnalysisError("the encoder did not return its layer outputs (encoder_states)")
    norm = getattr(encoder, "layer_norm", None)
    return [norm(s) if norm is not None else s for s in states]


def resolve_layer(layer: int, num_layers: int, option: str = "--layer") -> int:
    resolved = layer if layer >= 0 else num_layers + 1 + layer
    if not 0 <= resolved <= num_layers:
        raise AnalysisError(f"{option} {layer}: the encoder has layers 0 (embeddings) to {num_layers}")
    return resolved


@torch.no_grad()
def pooled_features(model, pipeline: TextPipeline, sentences: Sequence[str], layers: Sequence[int],
                    max_tokens: int = 6000) -> Dict[int, torch.Tensor]:
    """layer -> N x C: the mean of encoder layer l over each sentence's positions."""
    encoder = primary_encoder(model)
    dev = next(model.parameters()).device
    pad = pipeline.dictionary.pad()
    ids = [pipeline(s) for s in sentences]
    order = sorted(range(len(ids)), key=lambda i: ids[i].numel())
    out = {l: torch.zeros(len(ids), encoder.embed_tokens.embedding_dim) for l in layers}
    start = 0
    while start < len(order):
        longest, end = 0, start
        while end < len(order) and max(longest, ids[order[end]].numel()) * (end - start + 1) <= max_tokens:
            longest = max(longest, ids[order[end]].numel())
            end += 1
        end = max(end, start + 1)
        batch = [ids[i] for i in order[start:end]]
        tokens = data_utils.collate_tokens(batch, pad, left_pad=True).to(dev)
        lengths = torch.tensor([b.numel() for b in batch], device=dev)
        states = layer_outputs(encoder, encoder(tokens, src_lengths=lengths, return_all_hiddens=True))
        keep = tokens.ne(pad).t().unsqueeze(-1).float()  # T x B x 1
        for l in layers:
            mean = (states[l].float() * keep).sum(0) / keep.sum(0)
            out[l][torch.tensor(order[start:end])] = mean.cpu()
        start = end
    return out
