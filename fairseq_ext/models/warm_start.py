"""Warm start: a checkpoint of fairseq's stock ``transformer``, or of this model with other
options, loaded into any option set of the same sizes (fairseq's ``--finetune-from-model``,
or ``--restore-file`` with ``--reset-optimizer``; ``fairseq-ext train --init-from``).

Every tensor of the checkpoint whose name and shape the model has is taken as it is; a tensor
both have by name with other shapes (another width, another dictionary) is refused in one line
naming it, unless a technique below maps it. A
technique's new parameters are initialised, where the technique allows it, so that the new
model computes what the loaded one computed (the stock cross-attention's or self-attention's
weights moved to where the technique reads the top layer, the rest contributing nothing):

- MLMHA (M-00, M-01, M-10, M-11): the top layer's W^q, W^k, W^v and W_o are the stock
  cross-attention's; the other layers' W^q are zero where the logits are summed (U0 = 0),
  their W^v zero where the contexts are summed (U1 = 1), their blocks of W_o zero where they
  are concatenated (U1 = 0);
- parallel: the top layer's attention is the stock one, the others' output projections zero;
- S-Agg, Iter-S-Agg: the weight of the top layer is the identity, the others zero;
- DC: the global FI unit is the stock self-attention's q/k/v, and W_z = [0 ; W_o];
- auxiliary decoders: copies of the main decoder; AIF: every W^a zero;
- the pre-classifier projection: the identity.

Every other new parameter keeps the model's own initialisation (C-Agg, Iter-C-Agg,
transparent attention, serial, flat, hierarchical and MMA change what the decoder reads:
their warm start does not start from the loaded model's outputs). Each parameter that is zero
here still gets a gradient at the first step (its partner is not zero), so training moves it.
"""
import re
from typing import Dict, Set, Tuple

import torch
from torch import Tensor

from fairseq_ext.errors import CheckpointError
from fairseq_ext.guards.training_checks import WARM_START  # noqa: F401  (set by the trainer's guard)
PROJECTIONS = [f"{name}.{part}" for name in ("q_proj", "k_proj", "v_proj", "out_proj") for part in ("weight", "bias")]


class _State:
    """The state being made: the model's own, then the checkpoint's where it fits."""

    def __init__(self, model, loaded: Dict[str, Tensor]):
        for key, value in loaded.items():
            if not torch.is_tensor(value):
                raise CheckpointError(f"the checkpoint's {key} is a {type(value).__name__}, not a tensor")
        self.loaded, self.state = loaded, {}
        self.taken: Set[str] = set()
        self.mapped: Set[str] = set()
        self.used: Set[str] = set()
        for key, value in model.state_dict().items():
            found = loaded.get(key)
            if found is not None and found.shape == value.shape:
                self.state[key] = found.to(value.dtype)
                self.taken.add(key)
                self.used.add(key)
            else:
                self.state[key] = value.detach().clone()

    def fresh(self, prefix: str) -> bool:
        """Whether some parameter under ``prefix`` was not in the checkpoint."""
        return any(k.startswith(prefix) and k not in self.taken for k in self.state)

    def copy(self, dst: str, src: str, make=None) -> bool:
        if dst not in self.state or dst in self.taken or src not in self.loaded:
            return False
        try:
            value = self.loaded[src] if make is None else make(self.loaded[src])
        except RuntimeError:  # a checkpoint of another width: said by warm_start_state
            return False
        if value.shape != self.state[dst].shape:
            return False
        self.state[dst] = value.to(self.state[dst].dtype)
        self.mapped.add(dst)
        self.used.add(src)
        return True

    def set(self, key: str, value: Tensor) -> None:
        if key in self.state and key not in self.taken:
            self.state[key] = value.to(self.state[key].dtype)
            self.mapped.add(key)


def warm_start_state(model, loaded: Dict[str, Tensor]) -> Tuple[Dict[str, Tensor], str]:
    """The state dict to load into ``model`` from the checkpoint's ``loaded`` (see the module
    docstring), and one line saying what was taken, mapped and new."""
    from fairseq_ext.modules.auxiliary_information_fusion import AuxiliaryInformationFusion
    from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention
    from fairseq_ext.modules.layer_aggregation import LayerAggregation
    from fairseq_ext.modules.multi_layer_multihead_attention import MultiLayerMultiheadAttention
    from fairseq_ext.modules.multi_source_attention import HierarchicalCrossAttention, ParallelCrossAttention

    s = _State(model, loaded)
    for prefix, module in model.named_modules():
        p = prefix + "." if prefix else ""
        if not s.fresh(p):
            continue
        if isinstance(module, MultiLayerMultiheadAttention):
            _mlmha(s, p, module)
        elif isinstance(module, ParallelCrossAttention):
            top = len(module.attentions) - 1
            for name in PROJECTIONS:
                s.copy(f"{p}attentions.{top}.{name}", f"{p}{name}")
            for i in range(top):
                for part in ("weight", "bias"):
                    s.set(f"{p}attentions.{i}.out_proj.{part}", torch.zeros_like(s.state[f"{p}attentions.{i}.out_proj.{part}"]))
        elif isinstance(module, HierarchicalCrossAttention):  # the stock weights where the top layer is read
            for name in PROJECTIONS:
                s.copy(f"{p}source_attentions.{len(module.source_attentions) - 1}.{name}", f"{p}{name}")
        elif isinstance(module, DualContextualAttention):
            for name in PROJECTIONS[:6]:
                s.copy(f"{p}global_fi.{name}", f"{p}{name}")
            s.copy(f"{p}out_proj.weight", f"{p}out_proj.weight", lambda w: torch.cat([torch.zeros_like(w), w], dim=1))
            s.copy(f"{p}out_proj.bias", f"{p}out_proj.bias")
        elif isinstance(module, LayerAggregation) and not module.concatenation:
            unit = len(module.units) - 1
            weights = [f"{p}units.{unit}.weights.{i}.weight" for i in range(len(module.units[unit].weights))]
            top = weights[0] if module.iterative else weights[-1]  # the top layer's input
            for key in weights:
                s.set(key, torch.eye(s.state[key].size(0)) if key == top else torch.zeros_like(s.state[key]))
        elif isinstance(module, AuxiliaryInformationFusion):
            for key in [k for k in s.state if k.startswith(p + "projections.")]:
                s.set(key, torch.zeros_like(s.state[key]))
    if "decoder.pre_classifier.weight" in s.state:
        s.set("decoder.pre_classifier.weight", torch.eye(s.state["decoder.pre_classifier.weight"].size(0)))
    for key in [k for k in s.state if k.startswith("decoder.aux_decoders.")]:
        main = "decoder." + key.split(".", 3)[3]  # decoder.aux_decoders.K.REST <- decoder.REST, as made above
        if main in s.state and key not in s.taken and s.state[main].shape == s.state[key].shape:
            s.set(key, s.state[main].clone())
    mismatched = [k for k in s.state if k in loaded and k not in s.taken and k not in s.mapped]
    if mismatched:
        first = mismatched[0]
        raise CheckpointError(
            f"the checkpoint's {first} is {tuple(loaded[first].shape)} but the model's is "
            f"{tuple(s.state[first].shape)}" + (f" ({len(mismatched) - 1} more tensors differ)" if len(mismatched) > 1
                                                else "") + ": a model of another size or dictionary; nothing loaded")
    return s.state, _summary(s)


def _mlmha(s: _State, p: str, module) -> None:
    top, dim = module.num_sources - 1, module.embed_dim
    for name in ("q_proj", "k_proj", "v_proj"):
        for part in ("weight", "bias"):
            s.copy(f"{p}{name}.{top}.{part}", f"{p}{name}.{part}")
    if module.sum_contexts:
        s.copy(f"{p}out_proj.weight", f"{p}out_proj.weight")
    else:  # W_o reads the concatenated contexts: the top layer's block is the stock W_o
        s.copy(f"{p}out_proj.weight", f"{p}out_proj.weight",
               lambda w: torch.cat([torch.zeros(dim, top * dim, dtype=w.dtype), w], dim=1))
    s.copy(f"{p}out_proj.bias", f"{p}out_proj.bias")
    if f"{p}q_proj.{top}.weight" not in s.mapped:
        return  # no stock cross-attention in the checkpoint: nothing to start from
    for i in range(top):
        zeroed = (["q_proj"] if not module.layer_specific else []) + (["v_proj"] if module.sum_contexts else [])
        for name in zeroed:
            for part in ("weight", "bias"):
                s.set(f"{p}{name}.{i}.{part}", torch.zeros_like(s.state[f"{p}{name}.{i}.{part}"]))


def _summary(s: _State) -> str:
    new = [k for k in s.state if k not in s.taken and k not in s.mapped]
    unused = [k for k in s.loaded if k not in s.used]

    def where(keys):  # module paths with layer numbers folded: decoder.layers.*.encoder_attn.k_proj.*
        paths = dict.fromkeys(re.sub(r"\.\d+(?=\.|$)", ".*", k.rsplit(".", 1)[0]) for k in keys)
        shown = list(paths)[:6]
        return ", ".join(shown) + (f" and {len(paths) - len(shown)} more" if len(paths) > len(shown) else "")

    line = (f"{len(s.taken)} tensors taken as they are, {len(s.mapped)} moved from the stock layout or set to "
            f"start from the checkpoint's outputs, {len(new)} new with their own initialisation")
    line += f" ({where(new)})" if new else ""
    line += f"; {len(unused)} of the checkpoint's tensors unused ({where(unused)})" if unused else ""
    return line
