#!/usr/bin/env python3
"""Write fairseq_ext/configs/tables/<table>.yaml from the papers' table list paper-tables.json (a maintainer's tool).

The YAML files are the source of truth and are edited by hand after generation: this tool
only writes a file that does not exist yet (or every file with --force, which discards the
hand edits: review `git diff` afterwards). It maps each row's technique, in the vocabulary
of paper-tables.json, to fairseq_ext flags, each printed column to where our number comes
from (``columns:``, COLUMN_RULES), and keeps the printed numbers verbatim. What only a
reader of the paper knows is added by hand: a row's ``compare_with`` (the row the paper
compares it with, when not the baseline), ``model`` and ``analysis`` (rows that report on
another row's model, such as the layers of one model), and ``analysis_args``.

    python scripts/make_table_configs.py --tables PATH/paper-tables.json [--force]
    python scripts/make_table_configs.py --tables PATH/paper-tables.json --printed tests/fixtures/paper-tables-printed.json

--printed writes what the tests hold the configs against (tests/reproduce/test_reproduce.py):
per table, each row's cited flag and its printed numbers, so that the test needs no copy of
paper-tables.json.
"""
import argparse
import json
import os
import re
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT_DIR = os.path.join(REPO, "fairseq_ext", "configs", "tables")

PAPERS = {  # file -> (id prefix, short name)
    "thesis-multi-layer-nmt-ampomah.txt": ("thesis", "Ampomah (2021), PhD thesis"),
    "mlmha-every-layer-counts-pbml2020.txt": ("mlmha", "Ampomah et al. (2020), Every layer counts, PBML"),
    "mixed-multi-head-self-attention.txt": ("mma", "Mixed multi-head self-attention"),
    "multi-source-input-combination.txt": ("ms", "Libovicky et al. (2018), input combination strategies"),
    "analyzing-word-translation-of-layers.txt": ("wt", "Xu et al. (2020), word translation of layers"),
}

# task string (prefix match, longest first) -> (dataset key of configs/tables/setups.yaml, BLEU flavour)
TASKS = [
    ("WMT14 En->De (newstest2014; case-sensitive detokenized BLEU", "wmt14-en-de", "detok-cased"),
    ("WMT14 En->De newstest2014 (3,003 sentences; tokenized", "wmt14-en-de", "tok-cased"),
    ("WMT14 En->De newstest2014 (tokenized", "wmt14-en-de", "tok-cased"),
    ("WMT14 En->De newstest2014 (word translation", "wmt14-en-de", "detok-cased"),
    ("WMT14 En->De newstest2014", "wmt14-en-de", "tok-lc"),
    ("WMT14 En->Fr", "wmt14-en-fr", "tok-cased"),
    ("WMT15 Cs->En", "wmt15-cs-en", "tok-cased"),
    ("IWSLT15 En->Vi", "iwslt15-en-vi", "detok-cased"),
    ("IWSLT15 Vi->En", "iwslt15-vi-en", "detok-cased"),
    ("IWSLT14 Es->En", "iwslt14-es-en", "tok-cased"),
    ("IWSLT14 En->Es", "iwslt14-en-es", "tok-cased"),
    ("IWSLT14 De->En lowercased", "iwslt14-de-en", "tok-lc"),
    ("IWSLT15 Fr->En", "iwslt15-fr-en", "tok-cased"),
    ("IWSLT15 En->Fr", "iwslt15-en-fr", "tok-cased"),
    ("IWSLT14 Ro->En", "iwslt14-ro-en", "tok-cased"),
    ("IWSLT14 En->Ro", "iwslt14-en-ro", "tok-cased"),
    ("WAT17 ASPEC En->Ja", "wat17-en-ja", "tok-cased"),
    ("WAT17 ASPEC Ja->En", "wat17-ja-en", "tok-cased"),
    ("SentEval probing, encoder of WMT14", "wmt14-en-de", "detok-cased"),
    ("SentEval probing", "iwslt15-en-vi", "detok-cased"),
    ("Multi30k MMT en(+image)->de", "multi30k-en-de", "detok-cased"),
    ("Multi30k MMT en(+image)->fr", "multi30k-en-fr", "detok-cased"),
    ("Multi30k MMT en(+image)->cs", "multi30k-en-cs", "detok-cased"),
    ("Europarl multi-source", "europarl-xx-cs", "detok-cased"),
]

# the training settings of each paper and data set (configs/tables/setups.yaml "trainings")
def training_for(prefix, dataset):
    wmt = dataset.startswith(("wmt", "wat"))
    if prefix in ("thesis", "mlmha"):
        return "thesis-wmt14" if wmt else "thesis-iwslt"
    if prefix == "mma":
        return "mma-wat" if wmt else "mma-iwslt"
    if prefix == "wt":
        return "wt-wmt14"
    return "ms-multi30k" if dataset.startswith("multi30k") else "ms-europarl"

# printed column -> where our number comes from (fairseq_ext/reproduce/tables.py SOURCES); the
# first rule whose pattern matches the whole column name
COLUMN_RULES = [
    (r"BLEU", lambda m: {"source": "bleu"}),
    (r"#Params( \(M\))?", lambda m: {"source": "params"}),
    (r"Train \(steps/s\)", lambda m: {"source": "train_speed"}),
    (r"Train time", lambda m: {"source": "train_time"}),
    (r"Decode \(tokens/s\)", lambda m: {"source": "decode_speed", "unit": "tokens/s"}),
    (r"Decode \(/s\).*", lambda m: {"source": "decode_time"}),
    (r"Speed up", lambda m: {"source": "decode_speedup"}),
    (r"Δ( vs .*)?", lambda m: {"source": "delta", "of": "BLEU"}),
    (r"METEOR", lambda m: {"source": "meteor"}),
    (r"adv\.BLEU \(random image\)", lambda m: {"source": "adversarial", "shuffled": "extra"}),
    (r"adversarial BLEU \(random (\w+)\)", lambda m: {"source": "adversarial", "shuffled": m.group(1)}),
    (r"ΔBLEU masking encoder layer (\d+)", lambda m: {"source": "layer_dependency", "layer": int(m.group(1))}),
    (r"BLEU Main-Decoder.*", lambda m: {"source": "decoders", "decoder": "main"}),
    (r"BLEU Aux-Decoder.*", lambda m: {"source": "decoders", "decoder": "aux"}),
    (r"probing accuracy (\w+) #AVG", lambda m: {"source": "probing", "task": "#AVG", "category": m.group(1)}),
    (r"probing accuracy \w+ (\w+)", lambda m: {"source": "probing", "task": m.group(1)}),
    (r"Encoder Acc", lambda m: {"source": "word_translation", "part": "encoder"}),
    (r"Decoder Acc", lambda m: {"source": "word_translation", "part": "decoder"}),
    (r"Decoder -(Self|Cross) attention Acc",
     lambda m: {"source": "word_translation", "part": f"-{m.group(1).lower()} attention"}),
    (r"(Encoder|Decoder) Δ", lambda m: {"source": "delta", "of": f"{m.group(1)} Acc"}),
    (r"Decoder -(Self|Cross) attention Δ",
     lambda m: {"source": "delta", "of": f"Decoder -{m.group(1)} attention Acc", "against_column": "Decoder Acc"}),
    (r"Acc", lambda m: {"source": "word_translation"}),  # the part differs per row (Table 3)
    (r"BLEU1 \(BPE.*", lambda m: {"source": "translate_from_layer", "metric": "BLEU-1"}),
    (r"BLEU \(BPE.*", lambda m: {"source": "translate_from_layer", "metric": "BLEU"}),
    (r"BLEU1 Δ", lambda m: {"source": "delta", "of": "BLEU1 (BPE, case-insensitive)"}),
    (r"BLEU Δ", lambda m: {"source": "delta", "of": "BLEU (BPE, case-insensitive)"}),
]


def column_for(metric):
    """The ``columns:`` entry of a printed column: its name, source and parameters."""
    for pattern, make in COLUMN_RULES:
        m = re.fullmatch(pattern, metric)
        if m:
            return {"name": metric, **make(m)}
    raise SystemExit(f"no column source for {metric!r}: add a rule to COLUMN_RULES")


def dataset_of(task):
    for prefix, key, flavour in sorted(TASKS, key=lambda t: -len(t[0])):
        if task.startswith(prefix):
            return key, flavour
    raise SystemExit(f"no dataset for task {task!r}: add it to TASKS")


def as_int(value):
    m = re.match(r"\s*(\d+)", str(value))
    return int(m.group(1)) if m else None


def flags_for(tech, prefix, dataset, notes):
    """fairseq_ext flags for a row's technique (paper-tables.json vocabulary)."""
    config = str(tech.get("config", "base"))
    small = config.startswith("small") and not (prefix == "mma" and dataset.startswith("wat"))
    if prefix == "mma":
        # the MMA paper's own setups (its Sec. 4): IWSLT 6+6, d 512, FFN 1024, 4 heads, dropout 0.3
        arch = "multilayer_transformer_mma_wmt_en_de" if dataset.startswith("wat") else "multilayer_transformer_mma_iwslt"
        preset = {"enc_layers": 6, "dec_layers": 6, "d_model": 512,
                  "d_ff": 2048 if dataset.startswith("wat") else 1024, "heads": 8 if dataset.startswith("wat") else 4}
    elif small:
        arch = "multilayer_transformer_iwslt"
        preset = {"enc_layers": 4, "dec_layers": 4, "d_model": 256, "d_ff": 1024, "heads": 4}
    else:
        arch = "multilayer_transformer_wmt_en_de"
        preset = {"enc_layers": 6, "dec_layers": 6, "d_model": 512, "d_ff": 2048, "heads": 8}
    flags = ["--arch", arch]
    if config.startswith("small (Table 5.1)"):
        tech = dict(tech, d_ff=512)
    for key, opts in (("enc_layers", ["--encoder-layers"]), ("dec_layers", ["--decoder-layers"]),
                      ("d_model", ["--encoder-embed-dim", "--decoder-embed-dim"]),
                      ("d_ff", ["--encoder-ffn-embed-dim", "--decoder-ffn-embed-dim"]),
                      ("heads", ["--encoder-attention-heads", "--decoder-attention-heads"])):
        value = as_int(tech.get(key, preset[key]))
        if key == "d_ff" and value == 4098:
            value = 4096
            notes.append("d_ff printed 4098; 4096 gives the printed #Params")
        if key in ("enc_layers", "dec_layers") and prefix == "ms":
            continue  # the multi-source setup sets its own depth
        if value is not None and value != preset[key]:
            for opt in opts:
                flags += [opt, str(value)]
    if prefix != "mma" and "dropout" in tech and str(tech["dropout"]) != "0.1":
        flags += ["--dropout", str(tech["dropout"])]
    ja = tech.get("joint_attention", "none")
    if ja and ja != "none":
        flags += ["--joint-attention", ja]
        n = as_int(tech.get("n"))
        enc = as_int(tech.get("enc_layers")) or preset["enc_layers"]
        if ja != "transparent" and prefix != "ms" and n and n != enc:
            flags += ["--joint-attention-layers", str(n)]
    aux = str(tech.get("aux_decoder_layers", "") or "")
    generic = {"i (one layer)": "1", "i,j (two layers)": "1,2", "i,j,k (three layers)": "1,2,3"}
    if aux in generic:
        notes.append(f"aux decoders '{aux}' (complexity per number of aux decoders): layers {generic[aux]} here")
        aux = generic[aux]
    if aux:
        flags += ["--aux-decoder-layers", aux]
    if str(tech.get("aux_fusion", "no")).startswith("yes"):
        flags += ["--aux-fusion"]
    for side in ("enc", "dec"):
        kind = tech.get(f"{side}_self_attention", "standard")
        full = "encoder" if side == "enc" else "decoder"
        if kind == "dc":
            flags += [f"--{full}-self-attention", "dc"]
            layers = tech.get(f"dc_{side}_layers")
            depth = as_int(tech.get(f"{side}_layers")) or preset[f"{side}_layers"]
            if layers and layers != f"1-{depth}":
                flags += [f"--dc-{full}-layers", str(layers)]
        elif kind == "mma":
            flags += ["--encoder-self-attention", "mma"]
    heads = str(tech.get("mma_heads", "") or "")
    if heads.startswith("G,") or heads.startswith("global"):
        spec = {"global + local heads (split not stated)": "G,G,L,L",
                "global + forward heads (split not stated)": "G,G,F,F",
                "global + backward heads (split not stated)": "G,G,B,B"}.get(heads, heads)
        if spec != heads:
            notes.append(f"MMA heads '{heads}': {spec} here (two of each)")
        if spec != "G,L,F,B":
            flags += ["--mma-heads", spec]
    window = as_int(tech.get("mma_window"))
    if window and window != 1:
        flags += ["--mma-window", str(window)]
    if str(tech.get("positional_embedding", "yes")).startswith("no"):
        flags += ["--no-encoder-positional-embeddings"]
    pcp = str(tech.get("pre_classifier_projection", "no"))
    if pcp == "yes":
        flags += ["--pre-classifier-projection"]
    return " ".join(flags)


def slug(text):
    text = text.replace("+", " plus ").replace("Δ", "delta")
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def metric_key(metric):
    return metric


def table_config(paper, table):
    prefix, paper_name = PAPERS[paper["file"]]
    number = table["id"].split()[-1]
    tid = f"{prefix}-{number}"
    rows, seen = [], {}
    datasets = {}
    baseline = None
    for row in table["rows"]:
        label = row.get("row_label") or row["row_name"]
        rid = slug(label) or slug(row["row_name"])
        if rid in seen:
            seen[rid] += 1
            rid = f"{rid}-{seen[rid]}"
        else:
            seen[rid] = 1
        paper_numbers = {}
        for cell in row["results"]:
            key, flavour = dataset_of(cell["task"])
            datasets.setdefault(key, {"task": cell["task"], "bleu": flavour})
            if cell["printed"] in ("-", "—", "–", ""):
                continue
            paper_numbers.setdefault(key, {})[metric_key(cell["metric"])] = cell["printed"]
        entry = {"id": rid, "label": label}
        if row.get("group"):
            entry["group"] = row["group"]
        if row["cited_system"]:
            entry["cited"] = row["technique"].get("cited_technique") or row["row_name"]
        else:
            notes = []
            key = next(iter(paper_numbers), next(iter(datasets)))
            entry["flags"] = flags_for(row["technique"], prefix, key, notes)
            if notes:
                entry["note"] = "; ".join(notes)
            if baseline is None and row["technique"].get("joint_attention", "none") in ("none", None) \
                    and not row["technique"].get("aux_decoder_layers") \
                    and row["technique"].get("enc_self_attention", "standard") == "standard":
                baseline = rid
        if isinstance(row.get("notes"), str) and row["notes"]:
            entry["paper_note"] = row["notes"]
        entry["paper"] = paper_numbers
        rows.append(entry)
    metrics = []
    for row in table["rows"]:
        for cell in row["results"]:
            if cell["metric"] not in metrics:
                metrics.append(cell["metric"])
    config = {
        "id": tid,
        "paper": paper_name,
        "source": f"{paper['file']}, {table['id']} (section {table.get('section', '?')})",
        "caption": table.get("caption", ""),
        "datasets": {k: {"task": v["task"], "bleu": v["bleu"], "training": training_for(prefix, k)}
                     for k, v in datasets.items()},
        "baseline": baseline,
        "columns": [column_for(m) for m in metrics],
    }
    if table.get("significance"):
        config["paper_significance"] = table["significance"]
    if table.get("notes"):
        config["paper_notes"] = table["notes"]
    config["rows"] = rows
    return tid, config


def write_printed(data: dict, out: str) -> None:
    """{table id: [{"cited": bool, "printed": [the row's printed numbers, sorted]}, ...]} of
    every results table, rows in the paper's order."""
    absent = ("-", "—", "–", "")
    tables = {}
    for paper in data["papers"]:
        for table in paper["results_tables"]:
            tid = f"{PAPERS[paper['file']][0]}-{table['id'].split()[-1]}"
            tables[tid] = [{"cited": bool(row["cited_system"]),
                            "printed": sorted(c["printed"] for c in row["results"] if c["printed"] not in absent)}
                           for row in table["rows"]]
    with open(out, "w", encoding="utf-8") as f:  # a row a line: a change to the fixture reads as a diff
        f.write("{\n" + ",\n".join(f"{json.dumps(tid)}: [\n" + ",\n".join(json.dumps(row, ensure_ascii=False)
                                                                          for row in tables[tid]) + "]"
                                    for tid in sorted(tables)) + "\n}\n")
    print(f"wrote {out}: {len(tables)} tables, {sum(len(rows) for rows in tables.values())} rows")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", required=True, help="paper-tables.json: every results table of the papers")
    ap.add_argument("--force", action="store_true", help="overwrite existing files (discards hand edits)")
    ap.add_argument("--printed", metavar="OUT", help="write only the rows' printed numbers (the tests' fixture)")
    args = ap.parse_args()
    with open(args.tables, encoding="utf-8") as f:
        data = json.load(f)
    if args.printed:
        write_printed(data, args.printed)
        return 0
    os.makedirs(OUT_DIR, exist_ok=True)
    for paper in data["papers"]:
        for table in paper["results_tables"]:
            tid, config = table_config(paper, table)
            path = os.path.join(OUT_DIR, f"{tid}.yaml")
            if os.path.exists(path) and not args.force:
                print(f"kept {path} (exists; --force overwrites)")
                continue
            header = (f"# {config['paper']}: {table['id']}. Generated from paper-tables.json by\n"
                      "# scripts/make_table_configs.py, then edited by hand: this file is the source of truth.\n"
                      "# Run: fairseq-ext reproduce " + tid + " --dry-run   (docs/reproduction.md)\n")
            with open(path, "w", encoding="utf-8") as f:
                f.write(header)
                yaml.safe_dump(config, f, sort_keys=False, allow_unicode=True, width=110)
            print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
