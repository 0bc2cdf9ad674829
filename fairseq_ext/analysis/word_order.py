"""Word-order sensitivity (MMA paper Sec. 5.1, Table 3): BLEU of each system trained with and without the encoder's
positional embedding (``--no-encoder-positional-embeddings``), the drop without positions and its paired-bootstrap
significance (sacreBLEU, same flavour), and, with several systems, each row's difference to the first system's row with
the same positions setting (the paper's Δ: "relative improvement over the counterpart of the Transformer baseline").

Whether a checkpoint has encoder positions is read from its own configuration (``--no-encoder-positional-embeddings``,
fairseq's ``--no-token-positional-embeddings``, which also drops the decoder's, ``--encoder-learned-pos``) and written
in the table; the checkpoints may be given in any order. A system is a pair (model, the same model without encoder
positions), formed

- by ``--pairs WITH:WITHOUT ...``: checkpoint names (``--names``, default: each checkpoint's
  directory), the model with encoder positions first;
- by ``--names``: two checkpoints given the same name are that system;
- otherwise from the configurations: a checkpoint without encoder positions pairs with the
  checkpoint with positions whose model options are the same except the positions (the
  options its architecture's ``add_args`` defines; memory settings aside). Two candidates
  for one checkpoint are an error that asks for ``--pairs``.

A system is named by the ``--names`` name of its model with positions, else from its configuration (Transformer,
Transformer MMA, Transformer DC, + the joint attention strategy). A checkpoint left without a counterpart is reported
alone: its row says so, the figure draws it hollow with no drop, and a warning names the closest checkpoint of the other
kind and the options they differ in.

    python -m fairseq_ext.analysis.word_order \\
        --checkpoint base/checkpoint_best.pt base-nopos/checkpoint_best.pt mma/checkpoint_best.pt mma-nopos/checkpoint_best.pt \\
        --names base base-nopos mma mma-nopos \\
        --data data-bin/iwslt14.de-en --out analysis/word_order --generate-args "--beam 5"

The BLEU flavour is the one ``fairseq-ext evaluate`` reports for the data (the paper's for
the recipe in DATA/prep.env, lowercased on data the recipe lowercased), or ``--flavour``.
Writes word_order.{md,csv,json} (per system: the row with positions, then the row
without; BLEU, delta = BLEU without - BLEU with, p and mark of that difference; with
several systems Δ, p and mark against the first system's counterpart; a note on a
checkpoint reported alone) and word_order.png (BLEU per system, with and without
positions); the decodings stay in OUT/<system>/pos and OUT/<system>/nopos (fairseq-ext evaluate
directories).
"""
import argparse
import logging
import os
import re
import shlex
import sys
from typing import Dict, List, Optional

from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_ext.analysis import AnalysisError, command, decoding
from fairseq_ext.analysis.figures import (FigureContext, add_caption, add_title, flavour_of, legend_outside, marks_note,
                                         names_for, pyplot, save_figure, system_colours)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common.checkpoints import checkpoint_config
from fairseq_ext.tools.significance import paired_significance

ANALYSIS = Analysis("word_order", "Word-order sensitivity", "MMA Table 3", order=110)
logger = logging.getLogger(__name__)


def encoder_positions(model_cfg) -> str:
    """The encoder's positional embedding as the configuration builds it: sinusoidal, learned or none."""
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


# what tells a model from its counterpart: where the encoder's positions come from
POSITION_OPTIONS = frozenset({"no_encoder_positional_embeddings", "no_token_positional_embeddings",
                              "encoder_learned_pos"})
# model options that change how the network is run (memory), not what it computes
RUNTIME_OPTIONS = frozenset({"checkpoint_activations", "offload_activations", "min_params_to_wrap"})


def architecture(model_cfg) -> Dict[str, object]:
    """The options its model class's ``add_args`` defines but the encoder positions, as the
    configuration holds them: two checkpoints with equal ones are counterparts."""
    arch = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None)
    model_class = ARCH_MODEL_REGISTRY.get(arch)
    if model_class is None:
        raise AnalysisError(f"architecture {arch!r} of a checkpoint is not registered with fairseq")
    parser = argparse.ArgumentParser(add_help=False)
    model_class.add_args(parser)
    options = set(vars(parser.parse_args([]))) - POSITION_OPTIONS - RUNTIME_OPTIONS
    return {"model": model_class.__name__, **{name: getattr(model_cfg, name, None) for name in sorted(options)}}


def _differences(a: Dict[str, object], b: Dict[str, object]) -> List[str]:
    return [f"--{k.replace('_', '-')}" if k != "model" else "model" for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k)]


def _given_pairs(checkpoints: List[str], names: Optional[List[str]], pairs: Optional[List[str]],
                 sides: List[str]) -> List[List[int]]:
    """The checkpoint indices of --pairs WITH:WITHOUT, else of checkpoints sharing a --names name."""
    if pairs:
        known = names_for(checkpoints, names)
        if len(set(known)) != len(known):
            raise AnalysisError("--pairs refers to checkpoints by name: give each checkpoint its own "
                                f"--names (now: {' '.join(known)})")
        index = {name: i for i, name in enumerate(known)}
        groups: List[List[int]] = []
        for spec in pairs:
            with_name, sep, without_name = spec.partition(":")
            for name in (with_name, without_name) if sep else ():
                if name not in index:
                    raise AnalysisError(f"--pairs {spec}: no checkpoint is named {name!r} "
                                        f"(the names: {', '.join(known)})")
            if not sep:
                raise AnalysisError(f"--pairs {spec}: expected WITH:WITHOUT, the names of a checkpoint with "
                                    f"encoder positions and of one without (the names: {', '.join(known)})")
            i, j = index[with_name], index[without_name]
            if sides[i] != "pos":
                raise AnalysisError(f"--pairs {spec}: {with_name} ({checkpoints[i]}) has no encoder positions "
                                    "(its configuration); name the model with positions first")
            if sides[j] != "nopos":
                raise AnalysisError(f"--pairs {spec}: {without_name} ({checkpoints[j]}) has encoder positions "
                                    "(its configuration); the second name is the model trained without")
            for k in (i, j):
                if any(k in g for g in groups):
                    raise AnalysisError(f"--pairs {spec}: {known[k]} is in two pairs")
            groups.append([i, j])
        return groups
    shared: Dict[str, List[int]] = {}
    for i, name in enumerate(names or []):
        shared.setdefault(name, []).append(i)
    groups = []
    for system, members in shared.items():
        if len(members) < 2:
            continue
        seen: Dict[str, int] = {}
        for i in members:
            side = sides[i]
            if side in seen:
                raise AnalysisError(
                    f"--checkpoint: {checkpoints[seen[side]]} and {checkpoints[i]} are both {system!r} "
                    f"{'without' if side == 'nopos' else 'with'} encoder positions (by their configurations); "
                    f"give each system one checkpoint with and one trained with --no-encoder-positional-embeddings "
                    f"(--names tells the systems apart)")
            seen[side] = i
        groups.append(members)
    return groups


def _pairs_by_architecture(indices: List[int], checkpoints: List[str], configs: list,
                           sides: List[str]) -> List[List[int]]:
    """Each checkpoint without positions with the one with positions of its architecture; the
    others alone (a warning names the closest candidate)."""
    archs = {i: architecture(configs[i]) for i in indices}
    with_pos = [i for i in indices if sides[i] == "pos"]
    without = [i for i in indices if sides[i] == "nopos"]
    match = {i: [j for j in (without if sides[i] == "pos" else with_pos) if archs[i] == archs[j]] for i in indices}
    for i in indices:
        if len(match[i]) > 1:
            kind = ("without", "with") if sides[i] == "nopos" else ("with", "without")
            raise AnalysisError(
                f"--checkpoint: {checkpoints[i]} ({kind[0]} encoder positions) has {len(match[i])} counterparts of its "
                f"architecture {kind[1]} encoder positions: {', '.join(checkpoints[j] for j in match[i])}; say which "
                "pairs with --pairs WITH:WITHOUT (checkpoint names)")
    groups = [[match[j][0], j] for j in without if match[j]]
    for i in indices:
        if match[i]:
            continue
        groups.append([i])
        others = without if sides[i] == "pos" else with_pos
        kind = "without" if sides[i] == "pos" else "with"
        closest = min(others, key=lambda j: len(_differences(archs[i], archs[j])), default=None)
        hint = "" if closest is None else (f" (closest: {checkpoints[closest]}, which differs in "
                                           f"{', '.join(_differences(archs[i], archs[closest]))})")
        logger.warning(f"{checkpoints[i]} has no counterpart {kind} encoder positions of the same "
                       f"architecture{hint}; it is reported alone (pair checkpoints with --pairs WITH:WITHOUT)")
    return groups


def pair_checkpoints(checkpoints: List[str], names: Optional[List[str]] = None,
                     pairs: Optional[List[str]] = None) -> Dict[str, Dict[str, dict]]:
    """{system: {"pos" | "nopos": {"checkpoint", "positions"}}}, in the order given; a system of
    one side is a checkpoint without counterpart."""
    if names and len(names) != len(checkpoints):
        raise AnalysisError(f"--names: {len(names)} names for {len(checkpoints)} checkpoints")
    configs = [checkpoint_config(c) for c in checkpoints]  # the model part of each
    sides = ["nopos" if encoder_positions(cfg) == "none" else "pos" for cfg in configs]
    groups = _given_pairs(checkpoints, names, pairs, sides)
    taken = {i for g in groups for i in g}
    groups += _pairs_by_architecture([i for i in range(len(checkpoints)) if i not in taken], checkpoints, configs,
                                     sides)
    groups.sort(key=min)
    # a system is named after its model with positions
    heads = [next((i for i in g if sides[i] == "pos"), g[0]) for g in groups]
    labels = [names[i] if names else system_name(configs[i]) for i in heads]
    if len(set(labels)) < len(labels):  # systems named from configurations: the directory tells them apart
        directories = names_for(checkpoints, None)
        labels = [f"{label} ({directories[i]})" if labels.count(label) > 1 else label
                  for label, i in zip(labels, heads)]
    return {label: {sides[i]: {"checkpoint": checkpoints[i], "positions": encoder_positions(configs[i])}
                    for i in sorted(group, key=lambda i: sides[i] != "pos")} for label, group in zip(labels, groups)}


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "system"


def word_order_rows(systems: Dict[str, Dict[str, dict]], data: str, split: str, out: str, generate_args=(),
                    flavour: Optional[str] = None, samples: int = 1000, cpu: bool = False,
                    marks: str = "mma", src: Optional[str] = None, tgt: Optional[str] = None) -> List[dict]:
    evals = {}
    for system, sides in systems.items():
        for side, entry in sides.items():
            evals[system, side] = decoding.evaluate(entry["checkpoint"], data, split,
                                                    os.path.join(out, _slug(system), side),
                                                    generate_args=generate_args, cpu=cpu, src=src, tgt=tgt)
    first = next(iter(evals.values()))
    flavour = flavour or first["headline"]
    refs = decoding.lines(first, flavour, "ref")
    hyps = {key: decoding.lines(e, flavour) for key, e in evals.items()}

    def bleu(key):
        return round(evals[key]["bleu"][flavour], 2)

    def compare(base_key, other_key):
        """(the difference in BLEU, p, mark) of ``other_key`` against ``base_key``."""
        other = paired_significance(refs, hyps[base_key], {"other": hyps[other_key]}, flavour=flavour,
                                    n_samples=samples, marks=marks)["other"]
        return round(bleu(other_key) - bleu(base_key), 2), other["p_value"], other["mark"]

    base_system = next(iter(systems))
    rows = []
    for system, sides in systems.items():
        for side in ("pos", "nopos"):
            if side not in sides:
                continue
            row = {"model": system, "encoder positions": sides[side]["positions"], "BLEU": bleu((system, side)),
                   "delta": None, "p": None, "mark": ""}
            if side == "nopos" and "pos" in sides:
                row["delta"], row["p"], row["mark"] = compare((system, "pos"), (system, "nopos"))
            if len(systems) > 1:
                vs_base = (f"Δ vs {base_system}", "p vs base", "mark vs base")
                row.update(zip(vs_base, (None, None, "")))
                if system != base_system and side in systems[base_system]:
                    row.update(zip(vs_base, compare((base_system, side), (system, side))))
            row["note"] = "" if len(sides) == 2 else \
                f"alone: no counterpart {'without' if side == 'pos' else 'with'} encoder positions"
            row.update({"flavour": flavour, "checkpoint": sides[side]["checkpoint"]})
            rows.append(row)
    return rows


def plot(rows: List[dict], path: str, context: Optional[FigureContext] = None, marks: str = "mma"):
    """Per system, BLEU with encoder positions (solid) and without (pale, dotted), the drop and its
    mark above the pair; a checkpoint without counterpart hollow and hatched, "alone"."""
    from matplotlib.patches import Patch

    systems = list(dict.fromkeys(r["model"] for r in rows))
    colours = system_colours(systems)
    paired = {s for s in systems if sum(r["model"] == s for r in rows) == 2}
    fig, ax = pyplot().subplots(figsize=(1.8 + 1.6 * len(systems), 3.5))
    width = 0.38
    handles = []
    for offset, label, with_positions in ((-width / 2, "with encoder positions", True),
                                          (width / 2, "without (- Position Embedding)", False)):
        drawn = [(x + offset, r) for x, system in enumerate(systems) if system in paired for r in rows
                 if r["model"] == system and (r["encoder positions"] != "none") == with_positions]
        if not drawn:
            continue
        bars = ax.bar([x for x, _ in drawn], [r["BLEU"] for _, r in drawn], width,
                      color=[colours[r["model"]] for _, r in drawn], edgecolor=[colours[r["model"]] for _, r in drawn])
        if not with_positions:
            for bar in bars:
                bar.set(facecolor=(*bar.get_facecolor()[:3], 0.4), hatch="..")
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
        handles.append(Patch(facecolor="0.35", edgecolor="0.35", label=label) if with_positions else
                       Patch(facecolor=(0.35, 0.35, 0.35, 0.4), edgecolor="0.35", hatch="..", label=label))
    alone = [(x, r) for x, system in enumerate(systems) if system not in paired for r in rows if r["model"] == system]
    if alone:
        bars = ax.bar([x for x, _ in alone], [r["BLEU"] for _, r in alone], width, fill=False, edgecolor="grey",
                      hatch="//")
        ax.bar_label(bars, labels=[f"{r['BLEU']:.2f}\nalone, {'with' if r['encoder positions'] != 'none' else 'no'} "
                                   "positions" for _, r in alone], fontsize=7, color="grey")
        handles.append(Patch(fill=False, edgecolor="grey", hatch="//", label="alone: no counterpart, no drop"))
    for x, system in enumerate(systems):
        drop = next((r for r in rows if r["model"] == system and r["delta"] is not None), None)
        if drop is not None:
            top = max(r["BLEU"] for r in rows if r["model"] == system)
            ax.annotate(f"Δ {drop['delta']:+.2f}{drop['mark']}", (x, top), xytext=(0, 12), textcoords="offset points",
                        ha="center", fontsize=8)
    ax.set_xticks(range(len(systems)), systems)
    ax.set_ylabel(f"BLEU ({flavour_of(rows)})")
    ax.margins(y=0.2)
    legend_outside(ax, fontsize=7, handles=handles)  # beside the bars, never over one
    add_title(fig, "BLEU with and without the encoder's positional embedding")
    add_caption(fig, f"BLEU ({flavour_of(rows)}) of each system with encoder positions (solid) and of its "
                     "counterpart trained without them (pale, dotted), in the system's colour. Δ: BLEU without "
                     f"minus BLEU with, marked by sacreBLEU's paired bootstrap, {marks_note(marks)}; no mark: not "
                     "significant.", width=max(fig.get_figwidth(), 6.5))
    return save_figure(fig, path, context)


def build_parser() -> argparse.ArgumentParser:
    ap = command.parser(__doc__)
    command.evaluation_arguments(ap, marks="mma")
    ap.add_argument("--pairs", nargs="+", metavar="WITH:WITHOUT",
                    help="counterparts by checkpoint name (--names, default: the checkpoint's directory): the model "
                         "with encoder positions, then the one trained without (default: pairs of checkpoints that "
                         "share a --names name, then of the same architecture by their configurations)")
    return ap


def execute(args, figures: FigureContext):
    systems = pair_checkpoints(args.checkpoint, args.names, args.pairs)
    for system, sides in systems.items():
        kind = "pair" if len(sides) == 2 else "alone"
        for side, entry in sides.items():
            print(f"{system} ({kind}): {entry['checkpoint']} has encoder positions: {entry['positions']} "
                  "(its configuration)")
    rows = word_order_rows(systems, args.data, args.split, args.out, shlex.split(args.generate_args), args.flavour,
                           args.samples, args.cpu, args.marks, args.src, args.tgt)
    command.write_table(rows, args.out, "word_order",
                "Word order: BLEU with and without the encoder's positional embedding (MMA paper Table 3)")
    plot(rows, os.path.join(args.out, "word_order.png"), figures, args.marks)


main = command.main(build_parser, execute)

if __name__ == "__main__":
    sys.exit(main())
