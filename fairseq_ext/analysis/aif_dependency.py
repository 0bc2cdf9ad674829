"""Auxiliary Information Fusion: how much the main decoder depends on its auxiliary decoders (thesis Sec. 4.5.5, Eq.
4.4-4.7, Figs. 4.7-4.8).

The "ind-decoder" is the same model with every AIF weight W^{a,i}_l set to zero, so that the AIF sublayer (Eq. 4.3, h_l
<- h_l + sum_i W^{a,i}_l f^i) passes h_l through unchanged. The main decoder translates each sentence greedily (y^m);
the ind-decoder reads the same previous tokens y^m_<t (teacher forcing), and per target token, per sentence Y and per
decoder layer l and cross-attention head h (natural log):

    D_yt  = KL(P_m(y_t) || P_ind(y_t))                                   (Eq. 4.4)
            P_m = P(y_t | y^m_<t, x; theta_m), P_ind = P(y_t | y^m_<t, x; theta_ind)
    D_Y   = (1 / |Y|) sum_{t=1..|Y|} D_yt                                (Eq. 4.5)
    D^l_h = KL(A^m_h || A^ind_h),  A_h in R^{Z x J}                      (Eq. 4.6)
    D^l   = (1 / N_h) sum_h D^l_h                                        (Eq. 4.7)

|Y| counts the end-of-sentence token (Fig. 4.8 shows it). Each row of A_h is a distribution
over the source positions; ``--attention-rows mean`` (default) averages the Z row
divergences, which is the KL of A_h / Z read as one distribution over the Z x J cells,
``sum`` adds them (the thesis does not say). D_Y and D^l_h are averaged over the sentences.
Several checkpoints (MS-1+AIF, MS-2+AIF, ...) are compared as in the thesis' figures.
Greedy search is fairseq's SequenceGenerator with beam 1 (the model's own incremental
decoding, auxiliary decoders in lock-step); the output length limit is
``--max-len-a * |x| + --max-len-b`` (fairseq-generate's defaults 0 and 200). The thesis uses 1k
random test pairs; ``--max-sentences N`` takes the N lowest ids (as every analysis here).

    python -m fairseq_ext.analysis.aif_dependency --checkpoint ms1aif/checkpoint_best.pt ms3aif/checkpoint_best.pt \\
        --names MS-1+AIF MS-3+AIF --data data-bin/iwslt15.en-vi --split test --max-sentences 1000 \\
        --sentence 17 --out analysis/aif

Writes summary.{md,csv,json} (model, sentences, mean D_Y, D^l per layer), per_sentence.*
(model, id, |Y|, D_Y, hypothesis), per_head.* (model, layer, head, D^l_h), tokens.* (D_yt of
every token of sentence --sentence, default the lowest analysed id), aif_dependency.png
(Fig. 4.7: (a) D_Y per model, (b) D^l per layer) and tokens.png (Fig. 4.8: D_yt per token).
"""
import copy
import os
import sys
import textwrap
from typing import Dict, List, Optional

import torch
from fairseq.data import data_utils

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.capture import capture_cross_attention, translate
from fairseq_ext.analysis.figures import (FIGURE_WIDTH, FigureContext, add_caption, layer_axes, names_for, pyplot,
                                         save_figure, system_colours)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints
from fairseq_ext.common.command_line import search_arguments
from fairseq_ext.modules.auxiliary_information_fusion import AuxiliaryInformationFusion

ANALYSIS = Analysis("aif_dependency", "AIF dependency", "thesis 4.5.5 (Eq. 4.4-4.7)", single=True, order=50,
                    needs=lambda options: options.aux_fusion,
                    lacks="it has no Auxiliary Information Fusion (--aux-fusion)")
# the cross-attention maps are compared layer by layer: every layer must have one
NO_CROSS_ATTENTION = "the decoder has no cross-attention (--no-cross-attention)"


def kl_divergence(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dimension from log-probabilities (0 log 0 = 0), in float64."""
    log_p, log_q = log_p.double(), log_q.double()
    terms = torch.where(torch.isneginf(log_p), torch.zeros_like(log_p), log_p.exp() * (log_p - log_q))
    return terms.sum(-1)


def aif_modules(model) -> List[AuxiliaryInformationFusion]:
    return [m for m in model.decoder.modules() if isinstance(m, AuxiliaryInformationFusion)]


def check_aif(model, what: str = "the model") -> None:
    if getattr(model.decoder, "decode_from", None) is not None:
        raise AnalysisError(f"{what} decodes from an auxiliary decoder (--decode-from); "
                            "the analysis needs the main decoder")
    if not getattr(model.decoder, "aux_fusion", False) or not aif_modules(model):
        raise AnalysisError(f"{what} has no Auxiliary Information Fusion: the AIF dependency needs a model trained "
                            "with --aux-decoder-layers L --aux-fusion")


def ind_decoder(model):
    """A copy of ``model`` with every AIF weight W^{a,i}_l zero (the thesis' ind-decoder)."""
    check_aif(model)
    ind = copy.deepcopy(model).eval()
    with torch.no_grad():
        for aif in aif_modules(ind):
            for p in aif.parameters():
                p.zero_()
    return ind


def compare(model, ind, sample, hypotheses: List[torch.Tensor], rows: str = "mean") -> List[dict]:
    """Both models teacher-forced on the main decoder's translations; per sentence: its id, tokens,
    ``D_yt`` (|Y|, Eq. 4.4), ``D_Y`` (Eq. 4.5) and ``attention`` (L x H, Eq. 4.6)."""
    dictionary = model.decoder.dictionary
    pad, eos = dictionary.pad(), dictionary.eos()
    dev = next(model.parameters()).device
    prev = data_utils.collate_tokens(hypotheses, pad, eos, left_pad=False, move_eos_to_beginning=True).to(dev)
    target = data_utils.collate_tokens(hypotheses, pad, eos, left_pad=False)
    inputs = {k: v for k, v in sample["net_input"].items() if k != "prev_output_tokens"}
    lprobs, attention = [], []
    with torch.no_grad():
        for m in (model, ind):
            with capture_cross_attention(m, missing=NO_CROSS_ATTENTION) as records:
                out = m(**inputs, prev_output_tokens=prev)
            lprobs.append(m.get_normalized_probs(out, log_probs=True).double().cpu())  # B x Z x V
            attention.append(torch.stack([records[i]["attention"].double().cpu() for i in sorted(records)],
                                         dim=1))  # B x L x H x Z x J
    d_tokens = kl_divergence(lprobs[0], lprobs[1])  # B x Z
    d_rows = kl_divergence(torch.log(attention[0]), torch.log(attention[1]))  # B x L x H x Z
    real = target.ne(pad)
    out = []
    for b, hyp in enumerate(hypotheses):
        n = int(real[b].sum())
        per_row = d_rows[b, :, :, :n]
        out.append({"id": int(sample["id"][b]), "tokens": hyp, "D_yt": d_tokens[b, :n],
                    "D_Y": d_tokens[b, :n].mean().item(),
                    "attention": per_row.mean(-1) if rows == "mean" else per_row.sum(-1)})
    return out


def analyse(model, task, split: str, max_sentences: Optional[int] = None, rows: str = "mean", max_len_a: float = 0.0,
            max_len_b: int = 200, cpu: bool = False, sentence: Optional[int] = None) -> List[dict]:
    """:func:`compare` over the sentences of ``split``, or over its sentence ``sentence`` alone."""
    ind, dev = ind_decoder(model), checkpoints.device(cpu)
    samples = command.batches(task, split, max_sentences=max_sentences, device=dev)
    if sentence is not None:
        dataset = task.dataset(split)
        if not 0 <= sentence < len(dataset):
            raise AnalysisError(f"--sentence {sentence}: the {split} split has {len(dataset)} sentences")
        samples = [command.to_device(dataset.collater([dataset[sentence]]), dev)]
    results = []
    for sample in samples:
        results += compare(model, ind, sample, translate(model, sample, 1, max_len_a, max_len_b), rows)
    return sorted(results, key=lambda r: r["id"])


def summarise(name: str, results: List[dict], dictionary) -> Dict[str, List[dict]]:
    attention = torch.stack([r["attention"] for r in results]).mean(0)  # L x H, mean over sentences
    d_y = torch.tensor([r["D_Y"] for r in results], dtype=torch.float64)
    summary = {"model": name, "sentences": len(results), "mean D_Y": d_y.mean().item()}
    summary.update({f"D^{l}": attention[l - 1].mean().item() for l in range(1, attention.size(0) + 1)})
    summary["mean D^l"] = attention.mean().item()
    per_sentence = [{"model": name, "id": r["id"], "|Y|": len(r["tokens"]), "D_Y": r["D_Y"],
                     "hypothesis": dictionary.string(r["tokens"][:-1])} for r in results]
    per_head = [{"model": name, "layer": l + 1, "head": h + 1, "D^l_h": attention[l, h].item()}
                for l in range(attention.size(0)) for h in range(attention.size(1))]
    return {"summary": [summary], "per_sentence": per_sentence, "per_head": per_head}


def plot_dependency(summary: List[dict], per_sentence: List[dict], per_head: List[dict], path: str,
                    context: Optional[FigureContext] = None):
    """Fig. 4.7: (a) D_Y per sentence and model (box); (b) D^l per layer and model, heads as dots."""
    names = [s["model"] for s in summary]
    colours = system_colours(names)
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(FIGURE_WIDTH, 3.8))
    a.boxplot([[r["D_Y"] for r in per_sentence if r["model"] == n] for n in names], showmeans=True)
    a.set_xticks(range(1, len(names) + 1), names)
    a.set(ylabel="D_Y (KL, nats)", title="(a) D_Y per sentence (Eq. 4.5; triangle: mean)")
    for s in summary:
        layers = sorted(int(k[2:]) for k in s if k.startswith("D^") and k[2:].isdigit())
        b.plot(layers, [s[f"D^{l}"] for l in layers], marker="o", color=colours[s["model"]], label=s["model"])
        heads = [r for r in per_head if r["model"] == s["model"]]
        b.scatter([r["layer"] for r in heads], [r["D^l_h"] for r in heads], s=10, color=colours[s["model"]], alpha=0.4)
        b.set_xticks(layers)
    b.set_title("(b) cross-attention: D^l (Eq. 4.7), dots: heads")
    layer_axes(b, "decoder layer", "D^l (KL, nats)")
    a.set_ylim(bottom=0)  # divergences compare by their size: both axes from 0
    b.set_ylim(bottom=0)
    add_caption(fig, "How much the main decoder depends on the auxiliary information it fuses: the main decoder "
                     "against the ind-decoder (every AIF weight zero), both teacher-forced on the main decoder's "
                     "greedy output. (a) D_Y, the mean over a sentence's tokens of KL(P_m(y_t) || P_ind(y_t)), "
                     "one value per sentence (box: quartiles and median, whiskers 1.5 IQR). (b) D^l, the mean "
                     "over heads of the KL between the two decoders' cross-attention in decoder layer l.")
    return save_figure(fig, path, context)


def plot_tokens(tokens: List[dict], path: str, context: Optional[FigureContext] = None):
    """Fig. 4.8: D_yt of every token of one sentence, one panel per model."""
    names = list(dict.fromkeys(r["model"] for r in tokens))
    colours = system_colours(names)
    fig, axes = pyplot().subplots(len(names), 1, figsize=(max(6, 0.45 * max(len(tokens), 1) / len(names)),
                                                       2.6 * len(names)), squeeze=False, sharey=True)
    for ax, name in zip(axes[:, 0], names):
        sel = [r for r in tokens if r["model"] == name]
        ax.bar(range(len(sel)), [r["D_yt"] for r in sel], color=colours[name])
        ax.set_xticks(range(len(sel)), [r["token"] for r in sel], rotation=45, ha="right")
        ax.set_ylabel("D_yt (KL, nats)")
        if sel:  # the whole source, BPE joined, wrapped to the panel's width
            source = sel[0]["source"].replace("@@ ", "")
            width = int(fig.get_figwidth() * 11)
            ax.set_title(textwrap.fill(f"{name}, sentence {sel[0]['sentence']}: {source}", width), fontsize=9)
        else:
            ax.set_title(name)
    add_caption(fig, "D_yt = KL(P_m(y_t) || P_ind(y_t)) of every token of the main decoder's greedy translation: "
                     "how far the main decoder's distribution moves when the AIF weights are zeroed (Eq. 4.4).")
    return save_figure(fig, path, context)


def build_parser():
    ap = command.parser(__doc__, max_sentences=True)
    ap.add_argument("--sentence", type=int, help="sentence id for the per-token figure (default: lowest analysed)")
    ap.add_argument("--attention-rows", default="mean", choices=["mean", "sum"],
                    help="how the Z query rows of KL(A^m_h || A^ind_h) are combined (Eq. 4.6)")
    search_arguments(ap, max_len=(0.0, 200), max_len_help="greedy output length limit a * |x| + b")
    return ap


def execute(args, figures: FigureContext):
    tables = {"summary": [], "per_sentence": [], "per_head": [], "tokens": []}
    decoding = dict(rows=args.attention_rows, max_len_a=args.max_len_a, max_len_b=args.max_len_b, cpu=args.cpu)
    for name, ckpt in zip(names_for(args.checkpoint, args.names), args.checkpoint):
        model, task = checkpoints.load_model(ckpt, args.data, split=args.split, overrides={"decode_from": "main"},
                                             cpu=args.cpu)
        check_aif(model, ckpt)
        results = analyse(model, task, args.split, args.max_sentences, **decoding)
        if not results:
            raise AnalysisError(f"no sentence of {args.split} analysed (--max-sentences {args.max_sentences})")
        dictionary = task.target_dictionary
        for table, rows in summarise(name, results, dictionary).items():
            tables[table] += rows
        sentence = results[0]["id"] if args.sentence is None else args.sentence
        chosen = next((r for r in results if r["id"] == sentence), None) \
            or analyse(model, task, args.split, sentence=sentence, **decoding)[0]
        source = task.source_dictionary.string(task.dataset(args.split)[chosen["id"]]["source"])
        tables["tokens"] += [{"model": name, "sentence": chosen["id"], "source": source, "position": t + 1,
                              "token": dictionary[int(tok)], "D_yt": d.item()}
                             for t, (tok, d) in enumerate(zip(chosen["tokens"], chosen["D_yt"]))]
    for table, title in (("summary", "AIF dependency: mean D_Y (Eq. 4.5) and D^l (Eq. 4.7)"),
                         ("per_head", "D^l_h per decoder layer and head (Eq. 4.6)"),
                         ("tokens", "D_yt per token (Eq. 4.4)"), ("per_sentence", "D_Y per sentence (Eq. 4.5)")):
        command.write_table(tables[table], args.out, table, title, ".4f")
    plot_dependency(tables["summary"], tables["per_sentence"], tables["per_head"],
                    os.path.join(args.out, "aif_dependency.png"), figures)
    plot_tokens(tables["tokens"], os.path.join(args.out, "tokens.png"), figures)


main = command.main(build_parser, execute)

if __name__ == "__main__":
    sys.exit(main())
