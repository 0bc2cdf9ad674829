"""Word-order sensitivity (MMA paper Sec. 5.1, Table 3): BLEU of each system trained with
and without the encoder's positional embedding (``--no-encoder-positional-embeddings``),
the drop without positions and its paired-bootstrap significance (sacreBLEU, same
flavour), and, with several systems, each row's difference to the first system's row with
the same positions setting (the paper's Δ: "relative improvement over the counterpart of
the Transformer baseline").

Whether a checkpoint has encoder positions is read from its own configuration
(``--no-encoder-positional-embeddings``, fairseq's ``--no-token-positional-embeddings``,
``--encoder-learned-pos``) and written in the table; the checkpoints may be given in any
order. ``--names`` gives the system of each checkpoint (the two checkpoints of one system
share it); by default it is read from the configuration too (Transformer, Transformer MMA,
Transformer DC, + the joint attention strategy).

    python -m fairseq_ext.analysis.word_order \\
        --checkpoint base/checkpoint_best.pt base-nopos/checkpoint_best.pt mma/checkpoint_best.pt mma-nopos/checkpoint_best.pt \\
        --data data-bin/iwslt14.de-en --out analysis/word_order --generate-args "--beam 5"

Writes word_order.{md,csv,json} (per system: the row with positions, then the row
without; BLEU, delta = BLEU without - BLEU with, p and mark of that difference; with
several systems Δ, p and mark against the first system's counterpart) and word_order.png
(BLEU per system, with and without positions); the decodings stay in OUT/<system>/pos and
OUT/<system>/nopos (evaluate.sh directories).
"""
import os
import re
import shlex
import sys
from typing import Dict, List, Optional

from fairseq_ext.analysis import common


def checkpoint_config(checkpoint: str):
    """The model configuration saved in ``checkpoint`` (loaded through the plugin's safe
    loader)."""
    return common.checkpoint_config(checkpoint, "model")


def encoder_positions(model_cfg) -> str:
    """``"sinusoidal"``, ``"learned"`` or ``"none"``: the encoder's positional embedding as
    the configuration builds it (the encoder drops it for --no-encoder-positional-embeddings,
    fairseq for --no-token-positional-embeddings, on both sides)."""
    if getattr(model_cfg, "no_encoder_positional_embeddings", False) or \
            getattr(model_cfg, "no_token_positional_embeddings", False):
        return "none"
    return "learned" if getattr(model_cfg, "encoder_learned_pos", False) else "sinusoidal"


def system_name(model_cfg) -> str:
    """Transformer [MMA | DC] [+ joint attention strategy], from the configuration."""
    kind = str(getattr(model_cfg, "encoder_self_attention", "standard") or "standard")
    name = {"mma": "Transformer MMA", "dc": "Transformer DC"}.get(kind, "Transformer")
    strategy = str(getattr(model_cfg, "joint_attention", "none") or "none")
    return name if strategy == "none" else f"{name} + {strategy}"


def pair_checkpoints(checkpoints: List[str], names: Optional[List[str]]) -> Dict[str, Dict[str, dict]]:
    """{system: {"pos" | "nopos": {"checkpoint", "positions"}}}, systems in the order given."""
    configs = [checkpoint_config(c) for c in checkpoints]
    if names and len(names) != len(checkpoints):
        raise common.AnalysisError(f"--names: {len(names)} names for {len(checkpoints)} checkpoints")
    systems: Dict[str, Dict[str, dict]] = {}
    for i, (ckpt, cfg) in enumerate(zip(checkpoints, configs)):
        system = names[i] if names else system_name(cfg)
        positions = encoder_positions(cfg)
        side = "nopos" if positions == "none" else "pos"
        entry = systems.setdefault(system, {})
        if side in entry:
            raise common.AnalysisError(
                f"--checkpoint: {entry[side]['checkpoint']} and {ckpt} are both {system!r} "
                f"{'without' if side == 'nopos' else 'with'} encoder positions (by their configurations); "
                f"give each system one checkpoint with and one trained with --no-encoder-positional-embeddings "
                f"(--names tells the systems apart)")
        entry[side] = {"checkpoint": ckpt, "positions": positions}
    return systems


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "system"


def word_order_rows(systems: Dict[str, Dict[str, dict]], data: str, split: str, out: str, generate_args=(),
                    flavour: Optional[str] = None, samples: int = 1000, cpu: bool = False,
                    marks: str = "mma", src: Optional[str] = None, tgt: Optional[str] = None) -> List[dict]:
    from fairseq_ext.tools.significance import paired_significance

    evals = {}
    for system, sides in systems.items():
        for side, entry in sides.items():
            evals[system, side] = common.evaluate(entry["checkpoint"], data, split,
                                                  os.path.join(out, _slug(system), side),
                                                  generate_args=generate_args, cpu=cpu, src=src, tgt=tgt)
    flavour = flavour or next(iter(evals.values()))["headline"]
    level = "tok" if flavour.startswith("tok") else "detok"
    first = next(iter(evals.values()))
    refs = common.read_lines(os.path.join(first["dir"], f"ref.{level}"))
    hyps = {key: common.read_lines(os.path.join(e["dir"], f"hyp.{level}")) for key, e in evals.items()}

    def compare(base_key, other_key):
        sig = paired_significance(refs, hyps[base_key], {"other": hyps[other_key]}, flavour=flavour,
                                  n_samples=samples, marks=marks)
        return sig["baseline"]["bleu"], sig["other"]

    base_system = next(iter(systems))
    several = len(systems) > 1
    rows = []
    for system, sides in systems.items():
        for side in ("pos", "nopos"):
            if side not in sides:
                continue
            bleu = round(evals[system, side]["bleu"][flavour], 2)
            row = {"model": system, "encoder positions": sides[side]["positions"], "BLEU": bleu,
                   "delta": None, "p": None, "mark": ""}
            if side == "nopos" and "pos" in sides:
                _, other = compare((system, "pos"), (system, "nopos"))
                with_pos = round(evals[system, "pos"]["bleu"][flavour], 2)
                row.update({"delta": round(bleu - with_pos, 2), "p": other["p_value"], "mark": other["mark"]})
            if several:
                row.update({f"Δ vs {base_system}": None, "p vs base": None, "mark vs base": ""})
                if system != base_system and side in systems[base_system]:
                    _, other = compare((base_system, side), (system, side))
                    base_bleu = round(evals[base_system, side]["bleu"][flavour], 2)
                    row.update({f"Δ vs {base_system}": round(bleu - base_bleu, 2),
                                "p vs base": other["p_value"], "mark vs base": other["mark"]})
            row.update({"flavour": flavour, "checkpoint": sides[side]["checkpoint"]})
            rows.append(row)
    return rows


def plot(rows: List[dict], path: str):
    """Grouped bars: per system, BLEU with and without encoder positions (the drop written
    above the pair)."""
    plt = common.pyplot()
    systems = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(systems), 3.5))
    width = 0.38
    for offset, label, with_positions in ((-width / 2, "with encoder positions", True),
                                          (width / 2, "without (- Position Embedding)", False)):
        xs, ys = [], []
        for x, system in enumerate(systems):
            for r in rows:
                if r["model"] == system and (r["encoder positions"] != "none") == with_positions:
                    xs.append(x + offset)
                    ys.append(r["BLEU"])
        bars = ax.bar(xs, ys, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    for x, system in enumerate(systems):
        drop = next((r for r in rows if r["model"] == system and r["delta"] is not None), None)
        if drop is not None:
            top = max(r["BLEU"] for r in rows if r["model"] == system)
            ax.annotate(f"Δ {drop['delta']:+.2f}{drop['mark']}", (x, top), xytext=(0, 12), textcoords="offset points",
                        ha="center", fontsize=8)
    ax.set_xticks(range(len(systems)), systems)
    ax.set_ylabel(f"BLEU ({rows[0]['flavour']})" if rows else "BLEU")
    ax.margins(y=0.2)
    ax.legend(fontsize=7, loc="lower right")
    common.save_figure(fig, path)
    return fig


def main(argv=None):
    common.setup_cli()
    ap = common.analysis_parser(__doc__)
    ap.add_argument("--generate-args", default="", help="fairseq-generate flags, e.g. '--beam 5'")
    ap.add_argument("--flavour", help="BLEU flavour (default: the one evaluate.sh reports for the data)")
    ap.add_argument("--samples", type=int, default=1000, help="paired bootstrap samples")
    ap.add_argument("--marks", default="mma", help="significance marks: thesis, mma or wt")
    common.language_arguments(ap)
    args = ap.parse_args(argv)
    systems = pair_checkpoints(args.checkpoint, args.names)
    for system, sides in systems.items():
        for side, entry in sides.items():
            print(f"{system}: {entry['checkpoint']} has encoder positions: {entry['positions']} (its configuration)")
    rows = word_order_rows(systems, args.data, args.split, args.out, shlex.split(args.generate_args), args.flavour,
                           args.samples, args.cpu, args.marks, args.src, args.tgt)
    common.write_table(rows, args.out, "word_order",
                       "Word order: BLEU with and without the encoder's positional embedding (MMA paper Table 3)")
    plot(rows, os.path.join(args.out, "word_order.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
