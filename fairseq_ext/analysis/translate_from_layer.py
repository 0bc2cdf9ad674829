"""Translating from an encoder layer (Xu et al. 2020, "Analyzing Word Translation of Transformer Layers", Sec. 3.3,
Table 2).

What the paper did: the output of encoder layer l at every source position goes through that layer's trained projection
(``word_translation``; the alignment weights w are not used) and the model's classifier, and the most probable token at
each position is the "translation": one target token per source token, in the source order, with no decoder. Here every
source token of a sentence is translated (its end-of-sentence position is not a source token and is left out), and the
argmax runs over the vocabulary without the padding, beginning- and end-of-sentence symbols, so that each source token
gives exactly one target token as in the paper (a predicted end-of-sentence would otherwise shorten the hypothesis). The
hypotheses are scored against the binarized references as they are, on BPE units and lowercased (sacreBLEU, ``--tokenize
none --lowercase``), as the paper's "BPEized case-insensitive BLEU": BLEU-1 (brevity penalty x unigram precision:
sacreBLEU with ``max_ngram_order=1``) and BLEU. FULL is the whole model, beam search (``--beam``, default 4 as the
paper) through fairseq's generator, scored the same way. Delta is the gain over the layer below (FULL: over the top
layer).

    python -m fairseq_ext.analysis.translate_from_layer --checkpoint base/checkpoint_best.pt \\
        --data data-bin/wmt14.en-de --split test --projections analysis/wt/projections.pt --out analysis/wt-enc

Without ``--projections`` the encoder layers' projections are trained first, as
``word_translation --parts encoder`` does (same options), and saved to OUT/projections.pt.
Writes translate_from_layer.{md,csv,json} (Table 2 layout), translate_from_layer.png (BLEU-1
and BLEU per layer, FULL dashed, the legend beside the panels) and the hypotheses of every layer, OUT/hyp.layer<l>.bpe and
OUT/hyp.full.bpe, with OUT/ref.bpe.
"""
import os
import sys
from typing import Dict, List, Optional, Sequence

import torch
from fairseq import utils
from fairseq.dataclass.configs import GenerationConfig
from sacrebleu.metrics import BLEU

from fairseq_ext.analysis import command
from fairseq_ext.analysis.capture import layer_outputs, primary_encoder
from fairseq_ext.analysis.figures import (FIGURE_WIDTH, FigureContext, add_caption, add_title, integer_ticks,
                                         legend_outside, names_for, pyplot, save_figure, system_colours)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.analysis.word_translation import add_training_arguments, load_projections, trained_probes
from fairseq_ext.common import checkpoints
from fairseq_ext.common.command_line import search_arguments
from fairseq_ext.standalone.corpus import write_lines

ANALYSIS = Analysis("translate_from_layer", "Translating from an encoder layer", "Xu et al. 2020, Table 2",
                    single=True, order=90)


def bleu_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Dict[str, float]:
    """BLEU-1 and BLEU (sacreBLEU, no tokenization, lowercased) of BPE strings."""
    refs = [list(references)]
    bleu1 = BLEU(tokenize="none", lowercase=True, max_ngram_order=1, force=True).corpus_score(list(hypotheses), refs)
    bleu = BLEU(tokenize="none", lowercase=True, force=True).corpus_score(list(hypotheses), refs)
    return {"BLEU-1": bleu1.score, "BLEU": bleu.score}


def token_string(dictionary, tokens: torch.Tensor) -> str:
    """BPE units of ``tokens``, without padding, EOS and BOS."""
    special = {dictionary.pad(), dictionary.eos(), dictionary.bos()}
    return " ".join(dictionary[int(t)] for t in tokens if int(t) not in special)


@torch.no_grad()
def layer_translations(model, task, split: str, probes, layers: Sequence[int], max_tokens: int = 4000,
                       max_sentences=None) -> Dict[str, List[str]]:
    """``layer<l>`` -> hypotheses, ``ref`` -> references, in sentence-id order."""
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    out: Dict[str, Dict[int, str]] = {**{f"layer{l}": {} for l in layers}, "ref": {}}
    encoder = primary_encoder(model)
    special = [tgt_dict.pad(), tgt_dict.eos(), tgt_dict.bos()]
    for sample in command.batches(task, split, max_tokens, max_sentences, next(model.parameters()).device):
        net = {k: v for k, v in sample["net_input"].items() if k != "prev_output_tokens"}
        states = layer_outputs(encoder, model.encoder(**net, return_all_hiddens=True))
        src = sample["net_input"]["src_tokens"]
        source_token = src.ne(src_dict.pad()) & src.ne(src_dict.eos())  # B x S
        ids = sample["id"].tolist()
        for b, i in enumerate(ids):
            out["ref"][i] = token_string(tgt_dict, utils.strip_pad(sample["target"][b], tgt_dict.pad()))
        for l in layers:
            logits = model.decoder.output_layer(probes[f"enc{l}"].projection(states[l].transpose(0, 1)))
            logits[..., special] = float("-inf")
            best = logits.argmax(-1)  # B x S
            for b, i in enumerate(ids):
                out[f"layer{l}"][i] = token_string(tgt_dict, best[b][source_token[b]])
    return {k: [v[i] for i in sorted(v)] for k, v in out.items()}


@torch.no_grad()
def full_translations(model, task, split: str, beam: int = 4, lenpen: float = 1.0, max_tokens: int = 4000,
                      max_sentences=None) -> List[str]:
    """The whole model's beam-search hypotheses (BPE units), in sentence-id order."""
    generator = task.build_generator([model], GenerationConfig(beam=beam, lenpen=lenpen))
    hyps: Dict[int, str] = {}
    for sample in command.batches(task, split, max_tokens, max_sentences, next(model.parameters()).device):
        for i, hypos in zip(sample["id"].tolist(), task.inference_step(generator, [model], sample)):
            hyps[i] = token_string(task.target_dictionary, hypos[0]["tokens"])
    return [hyps[i] for i in sorted(hyps)]


def table_rows(scores: Dict[str, Dict[str, float]], layers: Sequence[int]) -> List[dict]:
    rows, prev = [], None
    for key in [f"layer{l}" for l in layers] + (["full"] if "full" in scores else []):
        s = scores[key]
        rows.append({"layer": "FULL" if key == "full" else int(key[5:]), "BLEU-1": round(s["BLEU-1"], 2),
                     "BLEU-1 delta": round(s["BLEU-1"] - prev["BLEU-1"], 2) if prev else None,
                     "BLEU": round(s["BLEU"], 2), "BLEU delta": round(s["BLEU"] - prev["BLEU"], 2) if prev else None})
        prev = s
    return rows


def plot(models: Dict[str, List[dict]], path: str, context: Optional[FigureContext] = None):
    """BLEU-1 and BLEU per encoder layer, a line per model (name -> :func:`table_rows`), FULL dashed."""
    colours = system_colours(list(models))
    fig, axes = pyplot().subplots(1, 2, figsize=(FIGURE_WIDTH, 3.6))
    for ax, key in zip(axes, ("BLEU-1", "BLEU")):
        for name, rows in models.items():
            layer_rows = [r for r in rows if r["layer"] != "FULL"]
            ax.plot([r["layer"] for r in layer_rows], [r[key] for r in layer_rows], "o-", color=colours[name],
                    label=f"{name}: from encoder layer l")
            for r in rows:
                if r["layer"] == "FULL":
                    ax.axhline(r[key], color=colours[name], linestyle="--", label=f"{name}: FULL (beam search)")
        ax.set(ylim=(0, max(r[key] for rows in models.values() for r in rows) * 1.1),
               xlabel="encoder layer l (0 = embeddings)", ylabel=f"{key} (BPE, lowercased)")
        ax.set_title(key, fontsize=10)
        integer_ticks(ax.xaxis)
    legend_outside(axes[1])
    add_title(fig, "Translating straight from an encoder layer, without the decoder")
    add_caption(fig, "Each source token's output of encoder layer l, through that layer's trained projection and "
                     "the model's classifier, gives one target token (argmax; pad, BOS and EOS left out), in "
                     "source order. BLEU-1 (brevity penalty x unigram precision) and BLEU on BPE units, "
                     "lowercased (sacreBLEU). Dashed: FULL, the whole model with beam search, scored the same way.")
    return save_figure(fig, path, context)


def build_parser():
    ap = command.parser(__doc__, several=False, max_sentences=True)
    ap.add_argument("--projections", help="projections.pt written by word_translation (default: train them here)")
    search_arguments(ap, beam=4, beam_help="beam of the FULL row (0: no FULL row)", lenpen=True)
    return add_training_arguments(ap)


def execute(args, figures: FigureContext):
    def names_of(model):
        return [f"enc{l}" for l in range(len(primary_encoder(model).layers) + 1)]

    if args.projections:
        model, task = checkpoints.load_model(args.checkpoint, args.data, split=args.split, cpu=args.cpu)
        probes = load_projections(model, args.projections, names_of(model))
    else:
        model, task, probes = trained_probes(args, names_of)
    layers = list(range(len(primary_encoder(model).layers) + 1))
    probes.eval()
    texts = layer_translations(model, task, args.split, probes, layers, args.max_tokens, args.max_sentences)
    if args.beam > 0:
        texts["full"] = full_translations(model, task, args.split, args.beam, args.lenpen, args.max_tokens,
                                          args.max_sentences)
    os.makedirs(args.out, exist_ok=True)
    for key, lines in texts.items():
        name = "ref.bpe" if key == "ref" else f"hyp.{key}.bpe"
        write_lines(os.path.join(args.out, name), lines)
    scores = {k: bleu_scores(v, texts["ref"]) for k, v in texts.items() if k != "ref"}
    rows = table_rows(scores, layers)
    command.write_table(rows, args.out, "translate_from_layer",
                f"Translating from encoder layers ({args.split}, BPE, lowercased)")
    plot({names_for([args.checkpoint], args.names)[0]: rows}, os.path.join(args.out, "translate_from_layer.png"),
         figures)
    print(f"written: {args.out}/translate_from_layer.{{md,csv,json,png}}, hyp.*.bpe, ref.bpe "
          f"({len(texts['ref'])} sentences)")


main = command.main(build_parser, execute)

if __name__ == "__main__":
    sys.exit(main())
