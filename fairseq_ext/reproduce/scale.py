"""The scale our numbers were made at, per data set of a table: the data actually used, the test
set and its size, the models' sizes, the budget and updates, the device and seeds, decoding
and BLEU flavour; said in lines under the table's heading and in one sentence (the LaTeX
caption)."""
import json
import os
from typing import Dict, List, Optional, TypedDict

from fairseq_ext.common.data_text import read_prep_env
from fairseq_ext.reproduce.params import shape
from fairseq_ext.reproduce.planning import RunPlan, describe_budget
from fairseq_ext.reproduce.readers import RunData
from fairseq_ext.reproduce.records import Record
from fairseq_ext.reproduce.tables import Table


class Scale(TypedDict):
    """The scale of one data set's runs (the first run's, where they differ: its data, budget,
    device and decoding are the table's)."""
    paper: str  # the paper's task
    data: str  # the data set used
    substitute: bool
    substitution: str  # why and what, or ""
    test_set: str
    test_sentences: Optional[int]
    train_pairs: Optional[int]
    models: Dict[str, List[str]]  # the models' shape in words -> the rows of that shape
    params_m: Optional[List[float]]  # the least and most parameters (millions)
    budget: str  # in words
    updates: Optional[List[int]]  # the least and most updates done
    planned_updates: Optional[int]
    device: str
    seed: str  # the first run's seed, as text: the table JSON's format
    seeds: List[int]
    decoding: str
    bleu: str
    signature: str  # sacreBLEU's
    smoke: bool
    scale: str  # "smoke", "cpu" or ""


def _shape(plan: RunPlan, result: dict) -> dict:
    known = result.get("model") or {}
    return known if all(known.get(k) is not None for k in ("encoder_layers", "encoder_embed_dim")) \
        else shape(plan.model_flags)


def _shape_text(s: dict) -> str:
    return (f"{s.get('encoder_layers')}+{s.get('decoder_layers')} layers, d_model {s.get('encoder_embed_dim')}, "
            f"FFN {s.get('encoder_ffn_embed_dim')}, {s.get('encoder_attention_heads')} heads")


def scales(table: Table, plans: List[RunPlan], records: Optional[List[Record]] = None) -> Dict[str, Scale]:
    """Per data set, what our numbers were made with: the data actually used, the test set and
    its size, the models' sizes, the updates, decoding, BLEU flavour, and whether it is the
    smoke scale."""
    out = {}
    for dataset in table.datasets:
        group = [p for p in plans if p.dataset == dataset]
        if not group:
            continue
        first = group[0]
        env = read_prep_env(first.data_dir)
        results = {p.run_dir: RunData(p).result for p in group}
        done = [r for r in results.values() if r]
        shapes: Dict[str, List[str]] = {}
        for p in group:
            named = shapes.setdefault(_shape_text(_shape(p, results[p.run_dir])), [])
            if p.row not in named:  # a row's runs of several seeds: named once
                named.append(p.row)
        seeds = sorted({p.seed for p in group})
        params = sorted(r["params"] / 1e6 for r in done if r.get("params"))
        updates = sorted({r["updates"] for r in done if r.get("updates") is not None})
        planned = sorted({r["planned_updates"] for r in done if r.get("planned_updates")})
        signature = ""
        bleu_json = os.path.join(first.run_dir, "eval-test", "bleu.json")
        if os.path.exists(bleu_json):
            with open(bleu_json, encoding="utf-8") as f:
                signature = json.load(f).get(first.bleu, {}).get("signature", "")
        sentences = sorted({r["decode_sentences"] for r in done if r.get("decode_sentences")})
        out[dataset] = Scale(
            paper=table.datasets[dataset].get("task", dataset),
            data=first.data_key,
            substitute="in place of" in first.substitution,
            substitution=first.substitution,
            test_set=env.get("test_set", ""),
            test_sentences=int(env["test_pairs"]) if env.get("test_pairs", "").isdigit() else
            (sentences[0] if sentences else None),
            train_pairs=int(env["train_pairs"]) if env.get("train_pairs", "").isdigit() else None,
            models={text: rows for text, rows in shapes.items()},
            params_m=[round(params[0], 2), round(params[-1], 2)] if params else None,
            budget=describe_budget(first.budget if first.budget not in ("smoke", "paper") else ""),
            updates=[updates[0], updates[-1]] if updates else None,
            planned_updates=planned[-1] if len(planned) == 1 else None,
            device="CPU" if first.cpu else "GPU",
            seed=str(first.seed),
            seeds=seeds,
            decoding=" ".join(first.generate),
            bleu=first.bleu,
            signature=signature,
            smoke=first.smoke,
            scale=first.scale,
        )
    return out


def scale_lines(s: Scale) -> List[str]:
    data = (f"{s['data']}, a substitute ({s['substitution']})" if s["substitute"]
            else s["data"] + (f" ({s['substitution']})" if s["substitution"] else ""))
    test = (f"test set {s['test_set']}, " if s["test_set"] else "") + f"{s['test_sentences']:,} test sentences" \
        if s["test_sentences"] else "test set not prepared yet"
    train = (f"; {s['train_pairs']:,} training pairs" + (" (the --smoke cut)" if s["smoke"] else "")) \
        if s["train_pairs"] else ""
    models = "; ".join(text + (f" ({', '.join(rows)})" if len(s["models"]) > 1 else "")
                       for text, rows in s["models"].items())
    params = ""
    if s["params_m"]:
        low, high = s["params_m"]
        params = f"; {low:.2f}M parameters" if low == high else f"; {low:.2f}M to {high:.2f}M parameters"
    done = ""
    if s["updates"]:
        low, high = s["updates"]
        done = f"{low:,}" if low == high else f"{low:,} to {high:,}"
        done = f" ({done}" + (f" of {s['planned_updates']:,}" if s["planned_updates"] else "") + " updates done)"
    lines = [f"paper: {s['paper']}",
             f"ours: {data}; {test}{train}",
             f"model: {models}{params}",
             f"training: {s['budget']} per row{done}, {s['device']}, " + _seeds_text(s),
             f"decoding: {s['decoding'] or 'fairseq defaults'}; BLEU {s['bleu']}"
             + (f" (sacreBLEU {s['signature']})" if s["signature"] else "")]
    if s["smoke"]:
        lines.append("smoke scale: a check that every step runs end to end, on small substitute data and "
                     "narrow models; no number here is evidence for or against the paper")
    elif s.get("scale") == "cpu":
        lines.append("CPU scale (--cpu-scale): the paper's depth and technique at the quickstart's width and "
                     "schedule, on the substitute data in full; the models translate, but they are small and "
                     "short-trained, so a difference here is a first look, not a test of the paper's number")
    return lines


def _seeds_text(s: Scale) -> str:
    several = s.get("seeds") or []
    if len(several) < 2:
        return f"seed {s['seed']}"
    return f"seeds {', '.join(str(x) for x in several)} (each row once per seed)"


def scale_summary(s: Scale) -> str:
    """The scale in one sentence (the LaTeX caption)."""
    parts = [f"Ours: {s['data']}" + (" (substitute)" if s["substitute"] else ""),
             f"{s['test_sentences']:,} test sentences" if s["test_sentences"] else "test set not prepared",
             "; ".join(s["models"]), s["budget"] + " per row",
             _seeds_text(s) if len(s.get("seeds") or []) > 1 else "", s["decoding"], f"BLEU {s['bleu']}"]
    return ", ".join(p for p in parts if p) + (". Smoke scale: a pipeline check, not evidence." if s["smoke"] else
                                               ". CPU scale: small, short-trained models." if s.get("scale") == "cpu"
                                               else ".")
