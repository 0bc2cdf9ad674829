#!/usr/bin/env python
"""Print the parameter counts of every fairseq_ext configuration against the baseline.

    python scripts/param_table.py                   # base config (d 512), vocabulary of the thesis' 61.2M baseline
    python scripts/param_table.py --arch multilayer_transformer_iwslt --vocab 21200   # small config (12.8M baseline)

Counts are measured on models built through fairseq's own parser (shared embeddings), so
they are what `fairseq-train` would build; docs/architectures.md lists the formulas of the expected deltas.
"""
import argparse
import logging
import sys

from fairseq_ext.model_builder import build_model, make_dictionary

CONFIGS = [
    ("baseline", []),
    ("S-Agg", ["--joint-attention", "s-agg"]),
    ("Iter-S-Agg", ["--joint-attention", "iter-s-agg"]),
    ("C-Agg", ["--joint-attention", "c-agg"]),
    ("Iter-C-Agg", ["--joint-attention", "iter-c-agg"]),
    ("transparent", ["--joint-attention", "transparent"]),
    ("M-00", ["--joint-attention", "m-00"]),
    ("M-01", ["--joint-attention", "m-01"]),
    ("M-10", ["--joint-attention", "m-10"]),
    ("M-11", ["--joint-attention", "m-11"]),
    ("serial", ["--joint-attention", "serial"]),
    ("parallel", ["--joint-attention", "parallel"]),
    ("flat", ["--joint-attention", "flat"]),
    ("hierarchical", ["--joint-attention", "hierarchical"]),
    ("MS-1", ["--aux-decoder-layers", "1"]),
    ("MS-1+AIF", ["--aux-decoder-layers", "1", "--aux-fusion"]),
    ("MS-13+AIF", ["--aux-decoder-layers", "1,3", "--aux-fusion"]),
    ("Enc-DC (f=2)", ["--encoder-self-attention", "dc", "--dc-kernel-size", "2"]),
    ("Enc-DC (f=3)", ["--encoder-self-attention", "dc", "--dc-kernel-size", "3"]),
    ("Full-DC (f=3)", ["--encoder-self-attention", "dc", "--decoder-self-attention", "dc", "--dc-kernel-size", "3"]),
    ("MMA", ["--encoder-self-attention", "mma"]),
    ("pre-classifier projection", ["--pre-classifier-projection"]),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="multilayer_transformer_wmt_en_de")
    parser.add_argument("--vocab", type=int, default=33320, help="dictionary size (shared source/target)")
    parser.add_argument("extra", nargs="*", help="more fairseq flags for every configuration")
    cli = parser.parse_args()
    logging.disable(logging.WARNING)
    dictionary = make_dictionary(cli.vocab - 4)  # + fairseq's 4 special symbols
    baseline = None
    print(f"| model ({cli.arch}, vocab {len(dictionary)}) | #params (M) | delta (M) |")
    print("|---|---:|---:|")
    for name, flags in CONFIGS:
        model, _ = build_model(cli.arch, "--share-all-embeddings", *flags, *cli.extra, dictionary=dictionary,
                               seed=None, device="meta")
        total = sum(p.numel() for p in model.parameters())
        baseline = baseline if baseline is not None else total
        print(f"| {name} | {total / 1e6:.2f} | {(total - baseline) / 1e6:+.2f} |")


if __name__ == "__main__":
    sys.exit(main())
