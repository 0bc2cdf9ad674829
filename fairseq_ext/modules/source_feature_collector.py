"""Source Feature Collector (thesis 3.2): F^s = [f^1 .. f^n], the outputs of the top n
encoder layers ordered bottom to top (f^n = H^L_e). n = 1 is the standard Transformer.

The analysis switch of thesis Table 3.5 replaces a chosen f^i by zeros at inference.
"""
from typing import Dict, List, Optional

import torch
from torch import Tensor


def encoder_layer_outputs(encoder_out: Dict[str, List[Tensor]]) -> List[Tensor]:
    """[H^0_e (embeddings), H^1_e, ..., H^L_e], each T x B x C.

    The top entry is the encoder's final output, so a pre-norm encoder's final LayerNorm
    is included; for the default post-norm encoder it is the last layer's output.
    """
    states = list(encoder_out["encoder_states"])
    if not states:
        raise ValueError("the encoder did not return its layer outputs (encoder_states)")
    states[-1] = encoder_out["encoder_out"][0]
    return states


def collect_source_features(
    layer_outputs: List[Tensor], num_layers: int, mask_index: Optional[int] = None
) -> List[Tensor]:
    """f^1 .. f^n: the top ``num_layers`` encoder layers (not the embeddings), with f^i
    (1-based ``mask_index``) replaced by zeros when asked."""
    features = list(layer_outputs[len(layer_outputs) - num_layers:])
    if mask_index is not None:
        features[mask_index - 1] = torch.zeros_like(features[mask_index - 1])
    return features
