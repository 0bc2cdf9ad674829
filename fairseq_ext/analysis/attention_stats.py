"""Encoder self-attention: mean attention distance and entropy per head and layer
(thesis 3.5.3, MLMHA paper Sec. 7.3, Eq. 13-16; Figs. 3.8-3.12 / 5-9).

For head h of encoder layer l, with w^h_ij the weight of token i on token j of a sentence x
(padding excluded), over the sentences X of the split:

    D^l_h = sum_x sum_i sum_j w^h_ij d(i, j) / sum_x sum_i sum_j w^h_ij        (Eq. 13)
    D^l   = mean_h D^l_h                                                        (Eq. 14)
    E^l_h(x_i) = - sum_j w^h_ij log w^h_ij,  averaged over the tokens of X      (Eq. 15)
    E^l   = mean_h E^l_h                                                        (Eq. 16)

``--span as-printed`` (default) sums over j <= i with d = i - j, as the equations are printed
(they come from Vig & Belinkov's analysis of a left-to-right model); ``--span all`` sums over
every key with d = |i - j|, the reading for a bidirectional encoder. Dual Contextual layers
report their global FI unit and, as ``local``, the local FI unit (keys = the local context
of each position); MMA layers report each head as it is masked.

    python -m fairseq_ext.analysis.attention_stats --checkpoint base/checkpoint_best.pt m10/checkpoint_best.pt \\
        --names baseline M-10 --data data-bin/wmt14.en-de --split test --max-sentences 1500 --out analysis/attn

Writes per_head.{md,csv,json} (model, unit, layer, head, distance, entropy), per_layer.*,
heatmaps_<model>.png (distance and entropy, layer x head) and layers.png (per-layer means of
every model, as Figs. 3.11-3.12).
"""
import os
import sys
from typing import Dict, List

import torch

from fairseq_ext.analysis import common


def head_statistics(weights: torch.Tensor, pad: torch.Tensor, span: str = "as-printed") -> Dict[str, torch.Tensor]:
    """Sums for Eq. 13 and 15 over one batch: ``weights`` B x H x T x T (query i, key j),
    ``pad`` B x T (True = padding, excluded as query and key). Returns per head: the weighted
    distance sum, the weight sum, the entropy sum and the number of query tokens."""
    bsz, heads, tgt, src = weights.shape
    # positions counted from each sentence's first real token (sources are left-padded)
    offset = (pad.sum(1))[:, None]
    pos_q = torch.arange(tgt)[None, :] - offset  # B x T
    pos_k = torch.arange(src)[None, :] - offset
    diff = pos_q[:, :, None] - pos_k[:, None, :]  # B x T x S: i - j
    valid = (~pad)[:, :, None] & (~pad)[:, None, :]
    if span == "as-printed":
        keys = valid & (diff >= 0)
        dist = diff.clamp(min=0).float()
    elif span == "all":
        keys = valid
        dist = diff.abs().float()
    else:
        raise ValueError(f"--span: {span!r} is not as-printed or all")
    w = weights * keys[:, None].float()
    ent = -(w * torch.log(w.clamp(min=1e-30))).sum(-1)  # B x H x T
    queries = (~pad)[:, None, :].float()
    return {"distance": (w * dist[:, None]).sum((0, 2, 3)), "weight": w.sum((0, 2, 3)),
            "entropy": (ent * queries).sum((0, 2)), "tokens": queries.sum((0, 2)).expand(heads).clone()}


def collect(model, task, split: str, max_sentences=None, span: str = "as-printed", cpu: bool = False):
    """{unit: {layer: per-head sums}} over the split, from the model's own forward."""
    dev = common.device(cpu)
    totals: Dict[str, Dict[int, Dict[str, torch.Tensor]]] = {}
    pad_idx = task.source_dictionary.pad()
    with torch.no_grad(), common.capture_self_attention(model) as records:
        for sample in common.batches(task, split, max_sentences=max_sentences):
            sample = common.to_device(sample, dev)
            net = sample["net_input"]
            for layer in records.values():
                layer["global"].clear()
                layer["local"].clear()
            model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            pad = net["src_tokens"].eq(pad_idx).cpu()
            for index, layer in records.items():
                for unit in ("global", "local"):
                    if not layer[unit]:
                        continue
                    stats = head_statistics(layer[unit][0], pad, span)
                    slot = totals.setdefault(unit, {}).setdefault(index, {})
                    for k, v in stats.items():
                        slot[k] = slot.get(k, 0) + v
    return totals


def summarise(name: str, totals) -> List[dict]:
    rows = []
    for unit, layers in totals.items():
        for layer, s in sorted(layers.items()):
            distance = (s["distance"] / s["weight"].clamp(min=1e-30)).tolist()
            entropy = (s["entropy"] / s["tokens"].clamp(min=1)).tolist()
            for h, (d, e) in enumerate(zip(distance, entropy), start=1):
                rows.append({"model": name, "unit": unit, "layer": layer + 1, "head": h,
                             "distance": round(d, 4), "entropy": round(e, 4)})
    return rows


def per_layer(rows: List[dict]) -> List[dict]:
    out = {}
    for r in rows:
        key = (r["model"], r["unit"], r["layer"])
        out.setdefault(key, []).append(r)
    return [{"model": m, "unit": u, "layer": l, "distance": round(sum(x["distance"] for x in v) / len(v), 4),
             "entropy": round(sum(x["entropy"] for x in v) / len(v), 4)} for (m, u, l), v in out.items()]


def heatmaps(rows: List[dict], name: str, path: str):
    plt = common.pyplot()
    units = sorted({r["unit"] for r in rows if r["model"] == name})
    fig, axes = plt.subplots(len(units), 2, figsize=(9, 3.2 * len(units)), squeeze=False)
    for u, unit in enumerate(units):
        sel = [r for r in rows if r["model"] == name and r["unit"] == unit]
        layers, heads = max(r["layer"] for r in sel), max(r["head"] for r in sel)
        for c, metric in enumerate(("distance", "entropy")):
            grid = torch.zeros(layers, heads)
            for r in sel:
                grid[r["layer"] - 1, r["head"] - 1] = r[metric]
            ax = axes[u][c]
            im = ax.imshow(grid.numpy(), aspect="auto", origin="lower", cmap="viridis")
            ax.set_xticks(range(heads), [str(h) for h in range(1, heads + 1)])
            ax.set_yticks(range(layers), [str(l) for l in range(1, layers + 1)])
            ax.set_xlabel("head")
            ax.set_ylabel("encoder layer")
            ax.set_title(f"{name}{'' if unit == 'global' else ' (' + unit + ' FI)'}: mean attention {metric}")
            fig.colorbar(im, ax=ax)
    common.save_figure(fig, path)
    return fig


def layer_plot(layer_rows: List[dict], path: str):
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for (model, unit) in sorted({(r["model"], r["unit"]) for r in layer_rows}):
        sel = sorted((r for r in layer_rows if r["model"] == model and r["unit"] == unit), key=lambda r: r["layer"])
        label = model if unit == "global" else f"{model} ({unit} FI)"
        for ax, metric in zip(axes, ("distance", "entropy")):
            ax.plot([r["layer"] for r in sel], [r[metric] for r in sel], marker="o", label=label)
    for ax, metric in zip(axes, ("distance", "entropy")):
        ax.set_xlabel("encoder layer")
        ax.set_ylabel(f"mean attention {metric}")
        ax.legend()
    common.save_figure(fig, path)
    return fig


def main(argv=None):
    common.setup_cli()
    ap = common.analysis_parser(__doc__)
    ap.add_argument("--max-sentences", type=int, help="only the sentences with the lowest ids (e.g. 1500)")
    ap.add_argument("--span", default="as-printed", choices=["as-printed", "all"])
    args = ap.parse_args(argv)
    names = common.names_for(args.checkpoint, args.names)
    rows = []
    for name, ckpt in zip(names, args.checkpoint):
        model, task = common.load_model(ckpt, args.data, split=args.split, cpu=args.cpu)
        rows += summarise(name, collect(model, task, args.split, args.max_sentences, args.span, args.cpu))
    common.write_table(rows, args.out, "per_head", f"Encoder self-attention per head ({args.span})", ".4f")
    layers = per_layer(rows)
    common.write_table(layers, args.out, "per_layer", "Per encoder layer (mean over heads)", ".4f")
    for name in names:
        heatmaps(rows, name, os.path.join(args.out, f"heatmaps_{name}.png"))
    layer_plot(layers, os.path.join(args.out, "layers.png"))
    print(f"written: {args.out}/per_head.*, per_layer.*, heatmaps_*.png, layers.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
