"""Attention maps of one sentence (MMA paper Sec. 5.4, Fig. 3; multi-source paper Fig. 2 and
App. A): what the model's own forward computes, captured by forward hooks.

(a) Encoder self-attention: every head of every layer (the primary source's encoder in
    multi-source translation), titled with its type: G/L/F/B (global, local, forward,
    backward) for Mixed Multi-Head layers, global/local FI unit for Dual Contextual layers
    (both units are drawn).
(b) Decoder attention over the source, per decoder layer, for a translation of the
    sentence (fairseq's SequenceGenerator, beam ``--beam``; or ``--hypothesis``/``--reference``
    teacher-forced); the rows are the target tokens the decoder predicts. With a joint
    attention strategy also the attention over the collected encoder layers / the sources:

    - ``attention``: what the cross-attention returns (fairseq's layout, per head): the
      standard, transparent and layer-aggregation models attend one memory; MLMHA U0 = 0
      its joint softmax; U0 = 1 and parallel the mean of the per-source maps; flat the
      weights summed over the sources per position; hierarchical the first-level maps
      scaled by beta and summed (multi-source paper App. A);
    - ``per_source`` (i = 1..n): each source's own map: the serial sublayers, the parallel
      attentions, MLMHA U0 = 1's per-layer softmaxes and the hierarchical first level each
      sum to 1 per row; flat's one softmax split per source (the n maps together sum to 1);
    - ``beta`` (hierarchical, both forms): the second-level weights over the n contexts,
      Z x n (per head for hierarchical-shared, head-averaged for hierarchical, as the
      module computes it), multi-source paper Fig. 2;
    - ``layer_mix`` (transparent): softmax(w)_{:, j}, decoder layer j's weights over the
      embeddings and the L encoder layers.

    python -m fairseq_ext.analysis.attention_maps --checkpoint mma/checkpoint_best.pt \\
        --data data-bin/iwslt14.de-en --split test --sentence 17 --out analysis/maps/mma

Writes encoder_self_attention.png (rows: layers, columns: heads), decoder_attention.png
(rows: decoder layers, columns: the combined map, then each source's), context_weights.png
(hierarchical: beta per decoder layer) and attention_maps.json (tokens and every matrix,
per head). ``--source TEXT`` (already tokenized/BPE'd like the data) replaces the sentence
of the split (single-source models). Without ``--sentence`` and ``--source`` the sentence is
picked: the lowest id whose source has 12-20 tokens (end of sentence not counted), else the
lowest id of those closest to that length; the output says which.
"""
import argparse
import contextlib
import json
import os
import sys
from typing import Dict, List, Optional

import torch

from fairseq_ext.analysis import common

MMA_NAMES = {"G": "global", "L": "local", "F": "forward", "B": "backward"}
# source tokens of the sentence picked when none is named: enough for a pattern, few enough to read
READABLE_LENGTH = (12, 20)


# ---- what each layer is ------------------------------------------------------------------------

def encoder_layers(model):
    """The encoder layers whose self-attention is drawn (the primary source's encoder)."""
    encoders = getattr(model.encoder, "encoders", None) or [model.encoder]
    return encoders[0].layers


def head_titles(layer_module) -> Dict[str, List[str]]:
    """{unit: a title per head} of an encoder layer's self-attention: one unit (``global``)
    for standard and MMA layers, two (``global``, ``local``) for Dual Contextual layers."""
    from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention
    from fairseq_ext.modules.mixed_multihead_attention import MixedMultiheadAttention

    attn = layer_module.self_attn
    if isinstance(attn, MixedMultiheadAttention):
        return {"global": [f"h{h + 1} {t} ({MMA_NAMES[t]})" for h, t in enumerate(attn.head_types)]}
    if isinstance(attn, DualContextualAttention):
        return {unit: [f"h{h + 1} {unit} FI" for h in range(attn.num_heads)] for unit in ("global", "local")}
    return {"global": [f"h{h + 1}" for h in range(attn.num_heads)]}


def layer_kind(layer_module) -> str:
    from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention
    from fairseq_ext.modules.mixed_multihead_attention import MixedMultiheadAttention

    attn = layer_module.self_attn
    return "mma" if isinstance(attn, MixedMultiheadAttention) else "dc" if isinstance(
        attn, DualContextualAttention) else "standard"


def source_names(model, task) -> List[str]:
    """A name per source the cross-attention combines: the source languages in
    multi-source translation, else f^i (encoder layer l) for the collected layers."""
    from fairseq_ext.models.joint_attention_strategies import Memory

    options = model.decoder.options
    n = options.num_joint_layers
    if hasattr(model.encoder, "encoders"):
        return [task.cfg.source_lang] + list(task.extra_source_langs)
    if options.strategy.memory is not Memory.STACKED:
        return []
    num_layers = len(encoder_layers(model))
    return [f"f^{i} (enc L{num_layers - n + i})" for i in range(1, n + 1)]


# ---- capture -------------------------------------------------------------------------------------

@contextlib.contextmanager
def capture_cross_attention(model):
    """Record, during the model's own forward, every main-decoder layer's attention over the
    source: ``records[l]`` (l = 0..M-1) gets ``attention`` (B x H x Z x J, what the layer's
    cross-attention returns with need_head_weights), ``per_source`` {i: B x H x Z x J} and
    ``beta`` (B x H x Z x n, or B x 1 x Z x n when the module averages its heads); see the
    module docstring for what each strategy gives. The last forward call wins; the records
    are filled when the block ends.

    The layer's cross-attention part (the serial sublayers, if any, and its cross-attention)
    reports its weights through the attention modules' contract
    (``fairseq_ext.modules.attention_utils.record_attention_weights``)."""
    from fairseq_ext.modules.attention_utils import record_attention_weights

    layers = model.decoder.layers
    records = {i: {"attention": None, "per_source": {}, "beta": None} for i in range(len(layers))}
    parts = {i: [m for m in (getattr(layer, "serial_stack", None), layer.encoder_attn) if m is not None]
             for i, layer in enumerate(layers)}

    def cpu(weights):
        return None if weights is None else weights.float().cpu()

    with record_attention_weights([m for modules in parts.values() for m in modules]) as recorder:
        try:
            yield records
        finally:
            for index, modules in parts.items():
                rec = records[index]
                for module in modules:
                    report = recorder.last(module) or {}
                    rec["per_source"].update({i: cpu(w) for i, w in report.get("per_source", {}).items()})
                    if report.get("beta") is not None:
                        rec["beta"] = cpu(report["beta"])
                top = recorder.last(layers[index].encoder_attn) if layers[index].encoder_attn is not None else None
                rec["attention"] = cpu((top or {}).get("attention"))
                rec["per_source"] = dict(sorted(rec["per_source"].items()))


# ---- one sentence ----------------------------------------------------------------------------------

def default_sentence(task, split: str, readable=READABLE_LENGTH) -> int:
    """The sentence of ``split`` drawn when none is named: the lowest id whose (primary)
    source has ``readable`` tokens (inclusive, end of sentence not counted), else the lowest
    id of those closest to that length."""
    dataset = task.dataset(split)
    pair = getattr(dataset, "dataset", dataset)  # a multi-source dataset wraps its primary pair
    if len(pair) == 0:
        raise common.AnalysisError(f"--split {split}: no sentence")
    low, high = readable
    lengths = [int(n) - 1 for n in pair.src_sizes]
    return min(range(len(lengths)), key=lambda i: (max(low - lengths[i], lengths[i] - high, 0), i))


def sentence_sample(task, split: Optional[str], sentence: Optional[int], source: Optional[str]):
    """A batch of one sentence: sentence ``sentence`` of ``split`` (every source and the
    reference, as fairseq's collater builds it), or the tokenized text ``source``."""
    if source is not None:
        if hasattr(task, "extra_source_langs"):
            raise common.AnalysisError("--source: a multi-source model needs every source; use --sentence")
        src_dict = task.source_dictionary
        tokens = src_dict.encode_line(source, add_if_not_exist=False, append_eos=True).long()
        if tokens.size(0) > 1 and tokens[:-1].eq(src_dict.unk()).all():
            raise common.AnalysisError(f"--source {source!r}: every token is unknown to the source dictionary")
        return {"id": torch.tensor([0]), "net_input": {"src_tokens": tokens[None],
                                                       "src_lengths": torch.tensor([tokens.size(0)])}}
    dataset = task.dataset(split)
    if sentence is None or not 0 <= sentence < len(dataset):
        raise common.AnalysisError(f"--sentence {sentence}: {split} has sentences 0..{len(dataset) - 1}")
    return dataset.collater([dataset[sentence]])


def translate(model, task, sample, beam: int, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """The best hypothesis of fairseq's SequenceGenerator (tokens, ending with EOS)."""
    from fairseq.sequence_generator import SequenceGenerator

    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=max_len_a,
                                  max_len_b=max_len_b)
    with torch.no_grad():
        hypos = generator.forward(sample)
    return hypos[0][0]["tokens"]


def attention_maps(model, task, sample, target: torch.Tensor) -> dict:
    """Teacher-force ``target`` (ends with EOS) through the model on ``sample`` (one
    sentence) and return every map, batch dimension dropped, as tensors:
    {"encoder": [per layer {"kind", "titles", "global": H x T x T[, "local"]}],
     "decoder": [per layer {"attention": H x Z x J, "per_source": {i: H x Z x J}, "beta"}],
     "layer_mix": (L+1) x M or None}."""
    net = sample["net_input"]
    eos = task.target_dictionary.eos()
    prev = torch.cat([target.new_tensor([eos]), target[:-1]])[None]
    extra = {k: v for k, v in net.items() if k not in ("src_tokens", "src_lengths", "prev_output_tokens")}
    with torch.no_grad(), common.capture_self_attention(model) as enc, capture_cross_attention(model) as dec:
        model(net["src_tokens"], net["src_lengths"], prev, **extra)
    encoder = []
    for index, layer in enumerate(encoder_layers(model)):
        entry = {"layer": index + 1, "kind": layer_kind(layer), "titles": head_titles(layer),
                 "global": enc[index]["global"][-1][0]}
        if enc[index]["local"]:
            entry["local"] = enc[index]["local"][-1][0]
        encoder.append(entry)
    decoder = []
    for index in sorted(dec):
        rec = dec[index]
        decoder.append({"layer": index + 1,
                        "attention": None if rec["attention"] is None else rec["attention"][0],
                        "per_source": {i: w[0] for i, w in sorted(rec["per_source"].items())},
                        "beta": None if rec["beta"] is None else rec["beta"][0]})
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


# ---- figures -----------------------------------------------------------------------------------------

def _heatmap(ax, matrix, xlabels, ylabels, title, fontsize=6):
    ax.imshow(matrix, cmap="Blues", vmin=0.0, vmax=max(float(matrix.max()), 1e-6), aspect="auto")
    ax.set_title(title, fontsize=fontsize + 1)
    ax.set_xticks(range(len(xlabels)), xlabels, rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=fontsize)


def encoder_figure(maps: dict, tokens: List[str], path: str):
    """Rows: encoder layers; columns: heads (a Dual Contextual layer: its global FI heads,
    then its local FI heads). Returns the figure (one titled axis per drawn head)."""
    plt = common.pyplot()
    panels = [[(f"L{e['layer']} {title}", e[unit][h]) for unit, titles in e["titles"].items() if unit in e
               for h, title in enumerate(titles)] for e in maps["encoder"]]
    cols = max(len(p) for p in panels)
    size = 0.25 * len(tokens) + 1.2
    fig, axes = plt.subplots(len(panels), cols, figsize=(size * cols, size * len(panels)), squeeze=False)
    for r, row in enumerate(panels):
        for c in range(cols):
            if c < len(row):
                _heatmap(axes[r][c], row[c][1].numpy(), tokens, tokens, row[c][0])
            else:
                axes[r][c].remove()
    common.save_figure(fig, path)
    return fig


def decoder_figure(maps: dict, target: List[str], sources: List[List[str]], names: List[str], path: str):
    """Rows: decoder layers; columns: the layer's combined attention over the source, then
    each source's own map (head-averaged, as the multi-source paper's App. A draws them)."""
    plt = common.pyplot()
    rows = [d for d in maps["decoder"] if d["attention"] is not None or d["per_source"]]
    if not rows:
        raise common.AnalysisError("the decoder has no attention over the source")
    cols = 1 + max(len(d["per_source"]) for d in rows)
    width = 0.25 * len(sources[0]) + 1.2
    height = 0.25 * len(target) + 1.2
    fig, axes = plt.subplots(len(rows), cols, figsize=(width * cols, height * len(rows)), squeeze=False)
    for r, d in enumerate(rows):
        panels = []
        if d["attention"] is not None and maps["strategy"] != "serial":  # serial: the top one is f^n's map
            panels.append((f"dec L{d['layer']}: attention", d["attention"], sources[0] if len(sources) == 1 or
                           not d["per_source"] else [""] * len(sources[0])))
        for i, w in d["per_source"].items():
            labels = sources[i] if i < len(sources) else sources[0]
            panels.append((f"dec L{d['layer']}: {names[i] if i < len(names) else i + 1}", w, labels))
        for c in range(cols):
            if c < len(panels):
                title, w, labels = panels[c]
                _heatmap(axes[r][c], w.mean(0).numpy(), labels, target, title)
            else:
                axes[r][c].remove()
    common.save_figure(fig, path)
    return fig


def context_figure(maps: dict, target: List[str], names: List[str], path: str):
    """Hierarchical combination: beta (head-averaged) per decoder layer, target tokens x
    sources (multi-source paper Fig. 2)."""
    plt = common.pyplot()
    rows = [d for d in maps["decoder"] if d["beta"] is not None]
    fig, axes = plt.subplots(1, len(rows), figsize=(1.6 + 0.6 * len(names) * len(rows), 0.25 * len(target) + 1.5),
                             squeeze=False)
    for ax, d in zip(axes[0], rows):
        _heatmap(ax, d["beta"].mean(0).numpy(), names, target, f"dec L{d['layer']}: beta", fontsize=7)
    common.save_figure(fig, path)
    return fig


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


def run(args) -> dict:
    name = common.names_for([args.checkpoint], getattr(args, "names", None))[0]
    model, task = common.load_model(args.checkpoint, args.data, split=None if args.source else args.split,
                                    cpu=args.cpu)
    sentence = args.sentence
    if args.source is None and sentence is None:
        sentence = default_sentence(task, args.split)
        low, high = READABLE_LENGTH
        print(f"sentence {sentence} of '{args.split}' (no --sentence or --source: the first one with {low}-{high} "
              f"source tokens, or the closest length)")
    sample = sentence_sample(task, args.split, sentence, args.source)
    sample = common.to_device(sample, common.device(args.cpu))
    tgt_dict = task.target_dictionary
    if args.hypothesis is not None:
        target = tgt_dict.encode_line(args.hypothesis, add_if_not_exist=False, append_eos=True).long()
        how = "teacher-forced --hypothesis"
    elif args.reference:
        if sample.get("target") is None:
            raise common.AnalysisError("--reference: the split has no target side")
        target = sample["target"][0]
        target = target[target.ne(tgt_dict.pad())]
        how = "teacher-forced reference"
    else:
        target = translate(model, task, sample, args.beam, args.max_len_a, args.max_len_b)
        how = f"beam {args.beam}"
    target = target.to(sample["net_input"]["src_tokens"].device)
    maps = attention_maps(model, task, sample, target)
    sources = memory_labels(model, task, sample)
    target_labels = token_labels(tgt_dict, target)
    names = source_names(model, task)
    os.makedirs(args.out, exist_ok=True)
    figures = {"encoder": encoder_figure(maps, sources[0][-sample["net_input"]["src_tokens"].size(1):],
                                         os.path.join(args.out, "encoder_self_attention.png")),
               "decoder": decoder_figure(maps, target_labels, sources, names,
                                         os.path.join(args.out, "decoder_attention.png"))}
    if any(d["beta"] is not None for d in maps["decoder"]):
        figures["context"] = context_figure(maps, target_labels, names, os.path.join(args.out, "context_weights.png"))
    meta = {"name": name, "checkpoint": args.checkpoint, "split": None if args.source else args.split,
            "sentence": None if args.source else sentence,
            "sentence_picked": args.source is None and args.sentence is None, "translation": how,
            "strategy": model.decoder.options.strategy.name,
            "translation_text": tgt_dict.string(target[:-1] if target[-1] == tgt_dict.eos() else target)}
    with open(os.path.join(args.out, "attention_maps.json"), "w", encoding="utf-8") as f:
        json.dump(to_json(maps, sources, target_labels, names, meta), f, ensure_ascii=False)
    print(f"{how}: {meta['translation_text']}")
    print(f"wrote {', '.join(sorted(os.listdir(args.out)))} to {args.out}")
    return {"maps": maps, "figures": figures, "source": sources, "target": target_labels, "names": names}


def main(argv=None):
    common.setup_cli()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="model checkpoint")
    ap.add_argument("--names", nargs="+", help="a name for the checkpoint (default: its directory)")
    ap.add_argument("--data", required=True, help="binarized data directory (its dictionaries, and the split)")
    ap.add_argument("--split", default="test")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--sentence", type=int, help="sentence id in --split (0-based, as fairseq numbers them; "
                       f"default: the first of {READABLE_LENGTH[0]}-{READABLE_LENGTH[1]} source tokens)")
    which.add_argument("--source", help="a source sentence, tokenized and BPE'd like the data")
    target = ap.add_mutually_exclusive_group()
    target.add_argument("--hypothesis", help="teacher-force this target (tokenized/BPE'd) instead of decoding")
    target.add_argument("--reference", action="store_true", help="teacher-force the split's reference")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--max-len-a", type=float, default=1.2)
    ap.add_argument("--max-len-b", type=int, default=10)
    ap.add_argument("--out", required=True, help="output directory (PNG, JSON)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    run(ap.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
