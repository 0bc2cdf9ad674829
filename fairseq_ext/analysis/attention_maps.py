"""Attention maps of one sentence (MMA paper Sec. 5.4, Fig. 3; multi-source paper Fig. 2 and App. A): what the model's
own forward computes, captured by forward hooks.

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
    - ``beta`` (hierarchical): the second-level weights over the n contexts, Z x n
      (head-averaged, as the module computes it), multi-source paper Fig. 2;
    - ``layer_mix`` (transparent): softmax(w)_{:, j}, decoder layer j's weights over the
      embeddings and the L encoder layers.

    python -m fairseq_ext.analysis.attention_maps --checkpoint mma/checkpoint_best.pt \\
        --data data-bin/iwslt14.de-en --split test --sentence 17 --out analysis/maps/mma

Figures, named after the checkpoint (``--names NAME``, default: the checkpoint's file stem, or its directory's name for
fairseq's checkpoint_best.pt and the like), each sized to be read at the HTML report's width (about 1100 px: token
labels of 6.5 to 9 points, as many panels a row as keep them so), every map on one colour scale (0 to 1, ``--scale
max``: 0 to the largest weight drawn) with a colour bar, a title naming the model, the data and the layer, and a caption
saying what the rows, columns and colours are:

- ``NAME_encoder_self_attention_L<l>.png``: one per encoder layer, every head of it;
  MMA heads titled with their type from the model's own ``--mma-heads`` (G global, L
  local, F forward, B backward, the caption says what each sees);
- ``NAME_decoder_attention_L<l>.png``: one per decoder layer, its attention over the
  source (head-averaged), then each source's own map;
- ``NAME_context_weights.png`` (hierarchical): beta per decoder layer;
- ``attention_maps.json``: the tokens and every matrix, per head, uncut.

``--max-tokens N`` (default 32) draws the first N source and target tokens, and the
caption says so. ``--source TEXT`` (already tokenized/BPE'd like the data) replaces the
sentence of the split (single-source models). Without ``--sentence`` and ``--source`` the
sentence is picked: the lowest id whose source has 12-20 tokens (end of sentence not
counted), else the lowest id of those closest to that length; the output says which.
"""
import json
import os
import re
import sys
from typing import Dict, List, Optional, Sequence

import torch

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.capture import (MMA_NAMES, capture_cross_attention, capture_self_attention, head_types,
                                          mma_legend, primary_encoder, translate)
from fairseq_ext.analysis.figures import (FigureContext, Panel, data_description, file_stem, map_figure, names_for,
                                         save_figure)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints
from fairseq_ext.common.command_line import search_arguments
from fairseq_ext.models.joint_attention_strategies import Memory
from fairseq_ext.modules.dual_contextual_attention import DualContextualAttention

ANALYSIS = Analysis("attention_maps", "Attention of one sentence", "MMA Fig. 3, multi-source Fig. 2 / App. A",
                    single=True, order=100)
# tokens drawn at most: up to 32, two panels a row keep their labels legible
DEFAULT_MAX_TOKENS = 32
# source tokens of the sentence picked when none is named: enough for a pattern, few enough to read
READABLE_LENGTH = (12, 20)
# fairseq's own checkpoint names, which say nothing of the model: its directory names it instead
FAIRSEQ_CHECKPOINT_NAME = re.compile(r"checkpoint(_best|_last|_avg\d*|\d+|_\d+_\d+)?")


def default_sentence(task, split: str, readable=READABLE_LENGTH) -> int:
    """The lowest id whose (primary) source has ``readable`` tokens (inclusive, end of sentence not
    counted), else the lowest of those closest to that length."""
    dataset = task.dataset(split)
    pair = getattr(dataset, "dataset", dataset)  # a multi-source dataset wraps its primary pair
    if len(pair) == 0:
        raise AnalysisError(f"--split {split}: no sentence")
    low, high = readable
    lengths = [int(n) - 1 for n in pair.src_sizes]
    return min(range(len(lengths)), key=lambda i: (max(low - lengths[i], lengths[i] - high, 0), i))


def sentence_sample(task, split: Optional[str], sentence: Optional[int], source: Optional[str]):
    """A batch of sentence ``sentence`` of ``split`` (as fairseq's collater builds it), or of the
    tokenized text ``source``."""
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


def head_titles(layer_module) -> Dict[str, List[str]]:
    """{unit: a title per head} of an encoder layer: ``global``, and ``local`` for Dual Contextual layers."""
    attn = layer_module.self_attn
    types = head_types(layer_module)
    if types is not None:
        return {"global": [f"h{h + 1} {t} ({MMA_NAMES[t]})" for h, t in enumerate(types)]}
    if isinstance(attn, DualContextualAttention):
        return {unit: [f"h{h + 1} {unit} FI" for h in range(attn.num_heads)] for unit in ("global", "local")}
    return {"global": [f"h{h + 1}" for h in range(attn.num_heads)]}


def attention_maps(model, task, sample, target: torch.Tensor) -> dict:
    """Every map of ``target`` (ends with EOS) teacher-forced on ``sample`` (one sentence), on the CPU:
    {"encoder": [per layer {"kind", "titles", "global": H x T x T[, "local"]}],
     "decoder": [per layer {"attention": H x Z x J, "per_source": {i: H x Z x J}, "beta"}],
     "layer_mix": (L+1) x M or None}."""
    net = sample["net_input"]
    prev = torch.cat([target.new_tensor([task.target_dictionary.eos()]), target[:-1]])[None]
    extra = {k: v for k, v in net.items() if k not in ("src_tokens", "src_lengths", "prev_output_tokens")}
    with torch.no_grad(), capture_self_attention(model) as enc, capture_cross_attention(model) as dec:
        model(net["src_tokens"], net["src_lengths"], prev, **extra)
    encoder = []
    for index, layer in enumerate(primary_encoder(model).layers):
        kind = "mma" if head_types(layer) is not None else "dc" if isinstance(
            layer.self_attn, DualContextualAttention) else "standard"
        entry = {"layer": index + 1, "kind": kind, "titles": head_titles(layer), "types": head_types(layer),
                 "window": getattr(layer.self_attn, "window", None), "global": enc[index]["global"][-1][0]}
        if enc[index]["local"]:
            entry["local"] = enc[index]["local"][-1][0]
        encoder.append(entry)

    def cpu(weights):
        return None if weights is None else weights[0].float().cpu()

    decoder = [{"layer": index + 1, "attention": cpu(dec[index]["attention"]),
                "per_source": {i: cpu(w) for i, w in sorted(dec[index]["per_source"].items())},
                "beta": cpu(dec[index]["beta"])} for index in sorted(dec)]
    mix = None
    memory = getattr(model.encoder, "memory_module", None)
    if model.decoder.options.strategy.name == "transparent" and memory is not None:
        mix = torch.softmax(memory.weight.detach().float(), dim=0).cpu()
    return {"encoder": encoder, "decoder": decoder, "layer_mix": mix, "strategy": model.decoder.options.strategy.name}


def token_labels(dictionary, tokens) -> List[str]:
    return ["" if t == dictionary.pad() else dictionary[t] for t in tokens.tolist()]


def memory_labels(model, task, sample) -> List[List[str]]:
    """The source tokens along the cross-attention's key axis J, per source (left-padded to one length)."""
    net = sample["net_input"]
    src = [net["src_tokens"][0]] + (list(net["extra_src_tokens"][0]) if "extra_src_tokens" in net else [])
    width = max(s.size(0) for s in src)
    return [[""] * (width - s.size(0)) + token_labels(task.source_dictionary, s) for s in src]


def source_names(model, task) -> List[str]:
    """A name per source the cross-attention combines: the languages, or f^i (enc Ll) per collected layer."""
    if hasattr(model.encoder, "encoders"):
        return [task.cfg.source_lang] + list(task.extra_source_langs)
    options = model.decoder.options
    if options.strategy.memory is not Memory.STACKED:
        return []
    n, num_layers = options.num_joint_layers, len(primary_encoder(model).layers)
    return [f"f^{i} (enc L{num_layers - n + i})" for i in range(1, n + 1)]


def to_json(maps: dict, source: List[List[str]], target: List[str], names: List[str], meta: dict) -> dict:
    def lst(t):
        return None if t is None else [[[round(float(v), 6) for v in row] for row in m] for m in t] \
            if t.dim() == 3 else t.tolist()

    return {**meta, "source_tokens": source, "target_tokens": target, "source_names": names,
            "encoder": [{"layer": e["layer"], "kind": e["kind"], "head_titles": e["titles"],
                         **{unit: lst(e[unit]) for unit in ("global", "local") if unit in e}} for e in maps["encoder"]],
            "decoder": [{"layer": d["layer"], "attention": lst(d["attention"]),
                         "per_source": {str(i + 1): lst(w) for i, w in d["per_source"].items()},
                         "beta": lst(d["beta"])} for d in maps["decoder"]],
            "layer_mix": None if maps["layer_mix"] is None else maps["layer_mix"].tolist()}


def cut_note(source: int, target: Optional[int], limit: Optional[int]) -> str:
    parts = [f"{n} {side} tokens" for n, side in ((source, "source"), (target, "target"))
             if n is not None and limit is not None and n > limit]
    if not parts:
        return ""
    # the columns are source tokens: cutting them leaves part of each row's weight undrawn
    rest = "; the rows drawn then sum to less than 1" if source > limit else ""
    return f" Only the first {limit} of the {' and '.join(parts)} are drawn (--max-tokens {limit}){rest}."


def scale_of(matrices, scale: str) -> float:
    """The top of the colour scale: 1 (``unit``) or the largest weight drawn (``max``)."""
    return 1.0 if scale == "unit" else max([float(m.max()) for m in matrices] + [1e-6])


def _draw(entries, per_layer, about, part: str, count: int, out: str, scale: str, caption, title: str,
          xlabel: str, ylabel: str, context) -> Dict[str, object]:
    """{OUT/<name>_PART_L<l>.png: figure} of each layer's panels, all on one colour scale."""
    vmax = scale_of([p.matrix for panels in per_layer for p in panels], scale)
    figures = {}
    for entry, panels in zip(entries, per_layer):
        path = os.path.join(out, f"{about['stem']}_{part}_L{entry['layer']:0{len(str(count))}d}.png")
        fig = map_figure(panels, f"{about['name']}: {title.format(layer=entry['layer'])} ({about['data']})",
                         caption(entry, vmax), vmax, xlabel, ylabel)
        figures[path] = save_figure(fig, path, context)
    return figures


def encoder_figures(maps: dict, tokens: List[str], about: dict, out: str, limit: Optional[int] = None,
                    scale: str = "unit", context: Optional[FigureContext] = None) -> Dict[str, object]:
    """{path: figure} of every head of each encoder layer (global FI heads, then local FI heads)."""
    encoder = maps["encoder"]
    shown = tokens[:limit]
    per_layer = [[Panel(title, e[unit][h][:len(shown), :len(shown)].numpy(), shown, shown)
                  for unit, titles in e["titles"].items() if unit in e for h, title in enumerate(titles)]
                 for e in encoder]
    letters = [t for e in encoder if e["kind"] == "mma" for t in e.get("types") or []]
    window = next((e.get("window") for e in encoder if e["kind"] == "mma"), None)
    units = (" Dual Contextual layers: the global FI unit's heads, then the local FI unit's (keys: the local "
             "context of each position)." if any(e["kind"] == "dc" for e in encoder) else "")

    def caption(entry, vmax):
        return (f"Encoder self-attention weights of layer {entry['layer']} of {len(encoder)}, per head, for "
                f"{about['sentence']}: row i = query token, column j = key token (tokens of the binarized source). "
                f"Colour: the attention weight, on one scale for every head and layer (0 to {vmax:.2g}, "
                f"--scale {scale})." + (" " + mma_legend(letters, window) if letters else "") + units
                + cut_note(len(tokens), None, limit))

    return _draw(encoder, per_layer, about, "encoder_self_attention", len(encoder), out, scale, caption,
                 "encoder self-attention, layer {layer}", "key token j", "query token i", context)


def decoder_figures(maps: dict, target: List[str], sources: List[List[str]], names: List[str], about: dict,
                    out: str, limit: Optional[int] = None, scale: str = "unit",
                    context: Optional[FigureContext] = None) -> Dict[str, object]:
    """{path: figure} per decoder layer (head-averaged, as multi-source App. A): its combined
    attention over the source, then each source's own map."""
    layers = [d for d in maps["decoder"] if d["attention"] is not None or d["per_source"]]
    if not layers:
        raise AnalysisError("the decoder has no attention over the source")
    rows = target[:limit]
    per_layer = []
    for entry in layers:
        panels = []
        if entry["attention"] is not None and maps["strategy"] != "serial":  # serial: the top one is f^n's map
            labels = sources[0] if len(sources) == 1 or not entry["per_source"] else [""] * len(sources[0])
            labels = labels[:limit]
            panels.append(Panel("attention" + (" (combined)" if entry["per_source"] else ""),
                                entry["attention"].mean(0)[:len(rows), :len(labels)].numpy(), labels, rows))
        for i, w in entry["per_source"].items():
            labels = (sources[i] if i < len(sources) else sources[0])[:limit]
            panels.append(Panel(names[i] if i < len(names) else f"source {i + 1}",
                                w.mean(0)[:len(rows), :len(labels)].numpy(), labels, rows))
        per_layer.append(panels)
    several = any(d["per_source"] for d in layers)

    def caption(entry, vmax):
        return (f"Attention of decoder layer {entry['layer']} of {len(maps['decoder'])} over the source, averaged "
                f"over its heads, for {about['sentence']} and {about['translation']}: row = the "
                f"target token the decoder predicts, column = source token (tokens of the binarized source)."
                + (" First the attention the layer's cross-attention returns, then each source's own map "
                   f"({maps['strategy']})." if several else "")
                + f" Colour: the attention weight, on one scale for every panel and layer (0 to {vmax:.2g}, "
                  f"--scale {scale}).{cut_note(len(sources[0]), len(target), limit)}")

    return _draw(layers, per_layer, about, "decoder_attention", len(maps["decoder"]), out, scale, caption,
                 "decoder attention over the source, layer {layer}", "source token", "target token", context)


def context_figure(maps: dict, target: List[str], names: List[str], about: dict, path: str,
                   limit: Optional[int] = None, scale: str = "unit", context: Optional[FigureContext] = None):
    """Hierarchical beta (head-averaged) per decoder layer, target tokens x sources (multi-source Fig. 2)."""
    rows = target[:limit]
    # short titles: a panel is only as wide as the n contexts
    panels = [Panel(f"layer {d['layer']}", d["beta"].mean(0)[:len(rows)].numpy(), names, rows)
              for d in maps["decoder"] if d["beta"] is not None]
    vmax = scale_of([p.matrix for p in panels], scale)
    caption = (f"Second-level weights beta of the hierarchical combination (multi-source paper Fig. 2) over the "
               f"{len(names)} contexts, per decoder layer (head-averaged), for {about['sentence']} and "
               f"{about['translation']}: row = the target token the decoder predicts. Colour: the weight, on one "
               f"scale (0 to {vmax:.2g}, --scale {scale}).{cut_note(0, len(target), limit)}")
    fig = map_figure(panels, f"{about['name']}: weights over the contexts per decoder layer ({about['data']})",
                     caption, vmax, "context", "target token", quantity="weight beta")
    return save_figure(fig, path, context)


def display_name(checkpoint: str, names: Optional[Sequence[str]] = None) -> str:
    """``--names NAME``, else the checkpoint's file stem, or for fairseq's own names
    (checkpoint_best.pt, checkpoint12.pt, ...) its directory's."""
    names = [names] if isinstance(names, str) else names
    if names:
        if len(names) != 1:
            raise AnalysisError(f"--names: {len(names)} names for one checkpoint")
        return names[0]
    stem = os.path.splitext(os.path.basename(checkpoint))[0]
    return names_for([checkpoint], None)[0] if FAIRSEQ_CHECKPOINT_NAME.fullmatch(stem) else stem


def target_of(args, model, task, sample):
    """(the target tokens the maps are drawn for, ending with EOS; how they were made)."""
    tgt_dict = task.target_dictionary
    if args.hypothesis is not None:
        return tgt_dict.encode_line(args.hypothesis, add_if_not_exist=False, append_eos=True).long(), \
            "teacher-forced --hypothesis"
    if args.reference:
        if sample.get("target") is None:
            raise AnalysisError("--reference: the split has no target side")
        target = sample["target"][0]
        return target[target.ne(tgt_dict.pad())], "teacher-forced reference"
    return translate(model, sample, args.beam, args.max_len_a, args.max_len_b)[0], f"beam {args.beam}"


def run(args, context: Optional[FigureContext] = None) -> dict:
    name = display_name(args.checkpoint, getattr(args, "names", None))
    limit = getattr(args, "max_tokens", DEFAULT_MAX_TOKENS)
    scale = getattr(args, "scale", "unit")
    split = None if args.source else args.split
    model, task = checkpoints.load_model(args.checkpoint, args.data, split=split, cpu=args.cpu)
    sentence = args.sentence
    if args.source is None and sentence is None:
        sentence = default_sentence(task, args.split)
        print(f"sentence {sentence} of '{args.split}' (no --sentence or --source: the first one with "
              f"{READABLE_LENGTH[0]}-{READABLE_LENGTH[1]} source tokens, or the closest length)")
    sample = command.to_device(sentence_sample(task, args.split, sentence, args.source), checkpoints.device(args.cpu))
    tgt_dict = task.target_dictionary
    target, how = target_of(args, model, task, sample)
    target = target.to(sample["net_input"]["src_tokens"].device)
    maps = attention_maps(model, task, sample, target)
    sources = memory_labels(model, task, sample)
    target_labels = token_labels(tgt_dict, target)
    names = source_names(model, task)
    data = data_description(args.data, split)
    about = {"name": name, "stem": file_stem(name),
             "data": f"--source, dictionaries of {data}" if args.source is not None else data,
             "sentence": "the given --source sentence" if args.source is not None else
             f"sentence {sentence} of '{args.split}'",
             "translation": f"its beam-{args.beam} translation" if how.startswith("beam") else f"the {how}"}
    os.makedirs(args.out, exist_ok=True)
    encoder_tokens = sources[0][-sample["net_input"]["src_tokens"].size(1):]
    figures = {"encoder": encoder_figures(maps, encoder_tokens, about, args.out, limit, scale, context),
               "decoder": decoder_figures(maps, target_labels, sources, names, about, args.out, limit, scale, context)}
    if any(d["beta"] is not None for d in maps["decoder"]):
        path = os.path.join(args.out, f"{about['stem']}_context_weights.png")
        figures["context"] = context_figure(maps, target_labels, names, about, path, limit, scale, context)
    meta = {"name": name, "checkpoint": args.checkpoint, "split": split, "sentence": None if args.source else sentence,
            "sentence_picked": args.source is None and args.sentence is None, "translation": how,
            "strategy": model.decoder.options.strategy.name,
            "translation_text": tgt_dict.string(target[:-1] if target[-1] == tgt_dict.eos() else target)}
    with open(os.path.join(args.out, "attention_maps.json"), "w", encoding="utf-8") as f:
        json.dump(to_json(maps, sources, target_labels, names, meta), f, ensure_ascii=False)
    print(f"{how}: {meta['translation_text']}")
    print(f"wrote {', '.join(sorted(os.listdir(args.out)))} to {args.out}")
    return {"maps": maps, "figures": figures, "source": sources, "target": target_labels, "names": names, "name": name}


def build_parser():
    ap = command.parser(__doc__, several=False, overrides={
        "--names": dict(nargs=None, metavar="NAME",
                        help="the checkpoint's name in figure titles and file names (default: its file stem; for "
                             "fairseq's checkpoint_best.pt and the like, its directory's name)"),
        "--data": dict(help="binarized data directory (its dictionaries, and the split)"),
        "--out": dict(help="output directory (PNG, JSON)")})
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--sentence", type=int, help="sentence id in --split (0-based, as fairseq numbers them; "
                       f"default: the first of {READABLE_LENGTH[0]}-{READABLE_LENGTH[1]} source tokens)")
    which.add_argument("--source", help="a source sentence, tokenized and BPE'd like the data")
    target = ap.add_mutually_exclusive_group()
    target.add_argument("--hypothesis", help="teacher-force this target (tokenized/BPE'd) instead of decoding")
    target.add_argument("--reference", action="store_true", help="teacher-force the split's reference")
    search_arguments(ap, beam=5, max_len=(1.2, 10))
    ap.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
                    help=f"draw the first N source and target tokens (default {DEFAULT_MAX_TOKENS}: their labels "
                         "stay legible at the report's width); the JSON keeps every token")
    ap.add_argument("--scale", choices=["unit", "max"], default="unit",
                    help="the colour scale: unit (default) 0 to 1 in every figure and model, so figures compare; "
                         "max 0 to the largest weight drawn (shared by the figures of one kind)")
    return ap


def execute(args, figures: FigureContext):
    if args.max_tokens < 1:
        raise AnalysisError(f"--max-tokens: expected 1 or more, not {args.max_tokens}")
    run(args, figures)


main = command.main(build_parser, execute)

if __name__ == "__main__":
    sys.exit(main())
