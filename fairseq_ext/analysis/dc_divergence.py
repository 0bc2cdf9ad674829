"""Dual Contextual layers: how far the local and the global Feature Interaction units attend
differently (thesis Sec. 5.6.2, Fig. 5.4). Per encoder layer l with DC:

    dv_l = JS(alpha_g || alpha_l) = 0.5 KL(alpha_g || m) + 0.5 KL(alpha_l || m),  m = (alpha_g + alpha_l) / 2
    Ed   = (1 / L) sum_l dv_l

with alpha_g / alpha_l the attention distributions of each query token over the sentence in
the global unit (keys r) and the local unit (keys = the local context l_c of each position),
averaged over the query tokens of the split (natural log). The thesis takes "the head with
the maximum weight distribution among all the heads"; ``--heads max`` (default) reads that
as the element-wise maximum over heads, renormalized to a distribution; ``mean`` averages the
heads; ``each`` computes JS per head and averages. Several checkpoints (e.g. kernel sizes
f = 2..8) give Fig. 5.4a (dv_l per layer, one series each) and 5.4b (Ed per model).

    python -m fairseq_ext.analysis.dc_divergence --checkpoint dc-f2/checkpoint_best.pt dc-f3/checkpoint_best.pt \\
        --names f=2 f=3 --data data-bin/wmt14.en-de --out analysis/dc --max-sentences 1500
"""
import argparse
import os
import sys

import torch

from fairseq_ext.common import checkpoints
from fairseq_ext.common.cli import setup_cli
from fairseq_ext.analysis import common


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """JS(p || q) over the last dimension (natural log; 0 log 0 = 0)."""
    m = 0.5 * (p + q)

    def kl(a, b):
        return torch.where(a > 0, a * (torch.log(a.clamp(min=1e-30)) - torch.log(b.clamp(min=1e-30))),
                           torch.zeros_like(a)).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def combine_heads(weights: torch.Tensor, how: str) -> torch.Tensor:
    """B x H x T x S -> B x T x S (``max``: element-wise max, renormalized; ``mean``)."""
    if how == "max":
        top = weights.max(dim=1).values
        return top / top.sum(-1, keepdim=True).clamp(min=1e-30)
    if how == "mean":
        return weights.mean(dim=1)
    raise ValueError(f"--heads: {how!r}")


def layer_divergences(model, task, split, heads="max", max_sentences=None, cpu=False):
    """{layer (1-based): mean JS over the query tokens of the split} for the DC layers."""
    dev = checkpoints.device(cpu)
    sums, counts = {}, {}
    pad_idx = task.source_dictionary.pad()
    with torch.no_grad(), common.capture_self_attention(model) as records:
        for sample in common.batches(task, split, max_sentences=max_sentences):
            sample = common.to_device(sample, dev)
            for r in records.values():
                r["global"].clear()
                r["local"].clear()
            net = sample["net_input"]
            model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            queries = net["src_tokens"].ne(pad_idx).cpu()  # B x T
            for index, r in records.items():
                if not r["local"]:
                    continue
                g, l = r["global"][0], r["local"][0]
                if heads == "each":
                    js = js_divergence(g, l).mean(1)  # B x T
                else:
                    js = js_divergence(combine_heads(g, heads), combine_heads(l, heads))
                sums[index + 1] = sums.get(index + 1, 0.0) + js[queries].sum().item()
                counts[index + 1] = counts.get(index + 1, 0) + int(queries.sum())
    if not sums:
        raise common.AnalysisError("the encoder has no Dual Contextual layer (--encoder-self-attention dc)")
    return {layer: sums[layer] / counts[layer] for layer in sorted(sums)}


def build_parser() -> argparse.ArgumentParser:
    """This command's options (the report reads them to give it only what it takes)."""
    ap = common.analysis_parser(__doc__)
    ap.add_argument("--heads", default="max", choices=["max", "mean", "each"])
    ap.add_argument("--max-sentences", type=int)
    return ap


def main(argv=None):
    setup_cli()
    ap = build_parser()
    args = ap.parse_args(argv)
    names = common.names_for(args.checkpoint, args.names)
    rows, summary = [], []
    for name, ckpt in zip(names, args.checkpoint):
        model, task = checkpoints.load_model(ckpt, args.data, split=args.split, cpu=args.cpu)
        dv = layer_divergences(model, task, args.split, args.heads, args.max_sentences, args.cpu)
        rows += [{"model": name, "layer": layer, "JS": round(v, 5)} for layer, v in dv.items()]
        summary.append({"model": name, "Ed": round(sum(dv.values()) / len(dv), 5), "DC layers": len(dv)})
    common.write_table(rows, args.out, "per_layer", f"JS(global || local) per DC layer (heads: {args.heads})", ".5f")
    common.write_table(summary, args.out, "summary", "Ed: mean over the DC layers", ".5f")
    plt = common.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    for name in names:
        sel = [r for r in rows if r["model"] == name]
        a.plot([r["layer"] for r in sel], [r["JS"] for r in sel], marker="o", label=name)
    a.set_xlabel("encoder layer")
    common.integer_ticks(a.xaxis)
    a.set_ylabel("JS divergence")
    a.legend()
    b.bar(range(len(summary)), [s["Ed"] for s in summary])
    b.set_xticks(range(len(summary)), [s["model"] for s in summary])
    b.set_ylabel("Ed")
    common.save_figure(fig, os.path.join(args.out, "dc_divergence.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
