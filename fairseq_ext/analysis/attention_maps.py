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
    - ``beta`` (hierarchical): the second-level weights over the n contexts, Z x n
      (head-averaged, as the module computes it), multi-source paper Fig. 2;
    - ``layer_mix`` (transparent): softmax(w)_{:, j}, decoder layer j's weights over the
      embeddings and the L encoder layers.

    python -m fairseq_ext.analysis.attention_maps --checkpoint mma/checkpoint_best.pt \\
        --data data-bin/iwslt14.de-en --split test --sentence 17 --out analysis/maps/mma

Figures, named after the checkpoint (``--names NAME``, default: the checkpoint's file stem,
or its directory's name for fairseq's checkpoint_best.pt and the like), each sized to be
read at the HTML report's width (about 1100 px: token labels of 6.5 to 9 points, as many
panels a row as keep them so), every map on one colour scale (0 to 1, ``--scale max``: 0 to
the largest weight drawn) with a colour bar, a title naming the model, the data and the
layer, and a caption saying what the rows, columns and colours are:

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
from typing import Optional, Sequence

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.attention_layers import source_names
from fairseq_ext.analysis.batches import to_device
from fairseq_ext.analysis.figures import FigureContext, data_description, file_stem, names_for
from fairseq_ext.analysis.map_figures import context_figure, decoder_figures, encoder_figures
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.analysis.sentence_maps import (READABLE_LENGTH, attention_maps, default_sentence, memory_labels,
                                                sentence_sample, to_json, token_labels, translate)
from fairseq_ext.common import checkpoints
from fairseq_ext.common.command_line import search_arguments

ANALYSIS = Analysis("attention_maps", "Attention of one sentence", "MMA Fig. 3, multi-source Fig. 2 / App. A",
                    single=True, order=100)
# tokens drawn at most: up to 32, two panels a row keep their labels legible
DEFAULT_MAX_TOKENS = 32
# fairseq's own checkpoint names, which say nothing of the model: its directory names it instead
FAIRSEQ_CHECKPOINT_NAME = re.compile(r"checkpoint(_best|_last|_avg\d*|\d+|_\d+_\d+)?")


def display_name(checkpoint: str, names: Optional[Sequence[str]] = None) -> str:
    """The name figures and file names give the checkpoint: ``--names NAME``, else the
    checkpoint's file stem (``mma.pt``: mma), else, for fairseq's own names
    (checkpoint_best.pt, checkpoint_last.pt, checkpoint12.pt, ...), its directory's."""
    if isinstance(names, str):
        names = [names]
    if names:
        if len(names) != 1:
            raise AnalysisError(f"--names: {len(names)} names for one checkpoint")
        return names[0]
    stem = os.path.splitext(os.path.basename(checkpoint))[0]
    if FAIRSEQ_CHECKPOINT_NAME.fullmatch(stem):
        return names_for([checkpoint], None)[0]
    return stem


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
    return translate(model, task, sample, args.beam, args.max_len_a, args.max_len_b), f"beam {args.beam}"


def run(args, context: Optional[FigureContext] = None) -> dict:
    """The maps, figures and JSON of the sentence ``args`` name (this command's options)."""
    name = display_name(args.checkpoint, getattr(args, "names", None))
    limit = getattr(args, "max_tokens", DEFAULT_MAX_TOKENS)
    scale = getattr(args, "scale", "unit")
    model, task = checkpoints.load_model(args.checkpoint, args.data, split=None if args.source else args.split,
                                         cpu=args.cpu)
    sentence = args.sentence
    if args.source is None and sentence is None:
        sentence = default_sentence(task, args.split)
        low, high = READABLE_LENGTH
        print(f"sentence {sentence} of '{args.split}' (no --sentence or --source: the first one with {low}-{high} "
              f"source tokens, or the closest length)")
    sample = to_device(sentence_sample(task, args.split, sentence, args.source), checkpoints.device(args.cpu))
    tgt_dict = task.target_dictionary
    target, how = target_of(args, model, task, sample)
    target = target.to(sample["net_input"]["src_tokens"].device)
    maps = attention_maps(model, task, sample, target)
    sources = memory_labels(model, task, sample)
    target_labels = token_labels(tgt_dict, target)
    names = source_names(model, task)
    about = {"name": name, "stem": file_stem(name),
             "data": data_description(args.data, None if args.source else args.split),
             "sentence": "the given --source sentence" if args.source is not None else
             f"sentence {sentence} of '{args.split}'",
             "translation": {"beam": f"its beam-{args.beam} translation",
                             "teacher-forced": f"the {how}"}[how.split()[0]]}
    if args.source is not None:
        about["data"] = f"--source, dictionaries of {about['data']}"
    os.makedirs(args.out, exist_ok=True)
    encoder_tokens = sources[0][-sample["net_input"]["src_tokens"].size(1):]
    figures = {"encoder": encoder_figures(maps, encoder_tokens, about, args.out, limit, scale, context),
               "decoder": decoder_figures(maps, target_labels, sources, names, about, args.out, limit, scale,
                                          context)}
    if any(d["beta"] is not None for d in maps["decoder"]):
        figures["context"] = context_figure(maps, target_labels, names, about,
                                            os.path.join(args.out, f"{about['stem']}_context_weights.png"),
                                            limit, scale, context)
    meta = {"name": name, "checkpoint": args.checkpoint, "split": None if args.source else args.split,
            "sentence": None if args.source else sentence,
            "sentence_picked": args.source is None and args.sentence is None, "translation": how,
            "strategy": model.decoder.options.strategy.name,
            "translation_text": tgt_dict.string(target[:-1] if target[-1] == tgt_dict.eos() else target)}
    with open(os.path.join(args.out, "attention_maps.json"), "w", encoding="utf-8") as f:
        json.dump(to_json(maps, sources, target_labels, names, meta), f, ensure_ascii=False)
    print(f"{how}: {meta['translation_text']}")
    print(f"wrote {', '.join(sorted(os.listdir(args.out)))} to {args.out}")
    return {"maps": maps, "figures": figures, "source": sources, "target": target_labels, "names": names,
            "name": name}


def build_parser():
    """This command's options (the report reads them to give it only what it takes)."""
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


def execute(args, figures: FigureContext) -> int:
    if args.max_tokens < 1:
        raise AnalysisError(f"--max-tokens: expected 1 or more, not {args.max_tokens}")
    run(args, figures)
    return 0


def main(argv=None):
    return command.run(build_parser, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
