"""Every attention map of one sentence: the sentence (picked, named, or given as text), its
translation (fairseq's SequenceGenerator, or a target teacher-forced), the maps the model's
own forward computes on it (encoder self-attention per head, decoder attention over the
source per layer and source, the hierarchical weights over the sources, the transparent
mix), the tokens along their axes, and all of it as JSON."""
from typing import List, Optional

import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.analysis.attention_layers import head_titles, head_types, layer_kind
from fairseq_ext.analysis.capture import capture_cross_attention, capture_self_attention, encoder_layers

# source tokens of the sentence picked when none is named: enough for a pattern, few enough to read
READABLE_LENGTH = (12, 20)


def default_sentence(task, split: str, readable=READABLE_LENGTH) -> int:
    """The sentence of ``split`` drawn when none is named: the lowest id whose (primary)
    source has ``readable`` tokens (inclusive, end of sentence not counted), else the lowest
    id of those closest to that length."""
    dataset = task.dataset(split)
    pair = getattr(dataset, "dataset", dataset)  # a multi-source dataset wraps its primary pair
    if len(pair) == 0:
        raise AnalysisError(f"--split {split}: no sentence")
    low, high = readable
    lengths = [int(n) - 1 for n in pair.src_sizes]
    return min(range(len(lengths)), key=lambda i: (max(low - lengths[i], lengths[i] - high, 0), i))


def sentence_sample(task, split: Optional[str], sentence: Optional[int], source: Optional[str]):
    """A batch of one sentence: sentence ``sentence`` of ``split`` (every source and the
    reference, as fairseq's collater builds it), or the tokenized text ``source``."""
    if source is not None:
        if hasattr(task, "extra_source_langs"):
            raise AnalysisError("--source: a multi-source model needs every source; use --sentence")
        src_dict = task.source_dictionary
        tokens = src_dict.encode_line(source, add_if_not_exist=False, append_eos=True).long()
        if tokens.size(0) > 1 and tokens[:-1].eq(src_dict.unk()).all():
            raise AnalysisError(f"--source {source!r}: every token is unknown to the source dictionary")
        return {"id": torch.tensor([0]), "net_input": {"src_tokens": tokens[None],
                                                       "src_lengths": torch.tensor([tokens.size(0)])}}
    dataset = task.dataset(split)
    if sentence is None or not 0 <= sentence < len(dataset):
        raise AnalysisError(f"--sentence {sentence}: {split} has sentences 0..{len(dataset) - 1}")
    return dataset.collater([dataset[sentence]])


def translate(model, task, sample, beam: int, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """The best hypothesis of fairseq's SequenceGenerator (tokens, ending with EOS)."""
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=max_len_a,
                                  max_len_b=max_len_b)
    with torch.no_grad():
        hypos = generator.forward(sample)
    return hypos[0][0]["tokens"]


def _cpu(weights: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if weights is None else weights[0].float().cpu()


def attention_maps(model, task, sample, target: torch.Tensor) -> dict:
    """Teacher-force ``target`` (ends with EOS) through the model on ``sample`` (one
    sentence) and return every map, batch dimension dropped, as tensors on the CPU:
    {"encoder": [per layer {"kind", "titles", "global": H x T x T[, "local"]}],
     "decoder": [per layer {"attention": H x Z x J, "per_source": {i: H x Z x J}, "beta"}],
     "layer_mix": (L+1) x M or None}."""
    net = sample["net_input"]
    eos = task.target_dictionary.eos()
    prev = torch.cat([target.new_tensor([eos]), target[:-1]])[None]
    extra = {k: v for k, v in net.items() if k not in ("src_tokens", "src_lengths", "prev_output_tokens")}
    with torch.no_grad(), capture_self_attention(model) as enc, capture_cross_attention(model) as dec:
        model(net["src_tokens"], net["src_lengths"], prev, **extra)
    encoder = []
    for index, layer in enumerate(encoder_layers(model)):
        entry = {"layer": index + 1, "kind": layer_kind(layer), "titles": head_titles(layer),
                 "types": head_types(layer), "window": getattr(layer.self_attn, "window", None),
                 "global": enc[index]["global"][-1][0]}
        if enc[index]["local"]:
            entry["local"] = enc[index]["local"][-1][0]
        encoder.append(entry)
    decoder = [{"layer": index + 1, "attention": _cpu(dec[index]["attention"]),
                "per_source": {i: _cpu(w) for i, w in sorted(dec[index]["per_source"].items())},
                "beta": _cpu(dec[index]["beta"])} for index in sorted(dec)]
    mix = None
    memory = getattr(model.encoder, "memory_module", None)
    if model.decoder.options.strategy.name == "transparent" and memory is not None:
        mix = torch.softmax(memory.weight.detach().float(), dim=0).cpu()
    return {"encoder": encoder, "decoder": decoder, "layer_mix": mix, "strategy": model.decoder.options.strategy.name}


def token_labels(dictionary, tokens) -> List[str]:
    return ["" if t == dictionary.pad() else dictionary[t] for t in tokens.tolist()]


def memory_labels(model, task, sample) -> List[List[str]]:
    """The source tokens along the cross-attention's key axis J, per source (the sources of
    multi-source translation are left-padded to one length; the layers share the tokens)."""
    net = sample["net_input"]
    src = [net["src_tokens"][0]]
    if "extra_src_tokens" in net:
        src += list(net["extra_src_tokens"][0])
    width = max(s.size(0) for s in src)
    d = task.source_dictionary
    return [[""] * (width - s.size(0)) + token_labels(d, s) for s in src]


def to_json(maps: dict, source: List[List[str]], target: List[str], names: List[str], meta: dict) -> dict:
    def lst(t):
        return None if t is None else [[[round(float(v), 6) for v in row] for row in m] for m in t] \
            if t.dim() == 3 else t.tolist()

    return {
        **meta,
        "source_tokens": source,
        "target_tokens": target,
        "source_names": names,
        "encoder": [{"layer": e["layer"], "kind": e["kind"], "head_titles": e["titles"],
                     **{unit: lst(e[unit]) for unit in ("global", "local") if unit in e}} for e in maps["encoder"]],
        "decoder": [{"layer": d["layer"], "attention": lst(d["attention"]),
                     "per_source": {str(i + 1): lst(w) for i, w in d["per_source"].items()},
                     "beta": lst(d["beta"])} for d in maps["decoder"]],
        "layer_mix": None if maps["layer_mix"] is None else maps["layer_mix"].tolist(),
    }
