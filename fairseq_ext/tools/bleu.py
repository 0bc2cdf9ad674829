#!/usr/bin/env python3
"""sacreBLEU in the four flavours the papers use, with signatures (called by evaluate.sh).

  detok  cased : detokenized text, tokenize 13a, case-sensitive   (WMT'14, En-Vi, Multi30k)
  detok  lc    : the same, lowercased (-lc)
  tok    cased : Moses-tokenized text, --tokenize none             (multi-bleu.perl style:
  tok    lc    : the same, lowercased                              Es-En, Fr, Ro; De-En lc)

Usage:
  score_bleu.py --hyp-detok H --ref-detok R [--hyp-tok H --ref-tok R] [--json OUT]
                [--headline detok-cased|detok-lc|tok-cased|tok-lc]
"""
import argparse
import json
import os
import sys

from sacrebleu.metrics import BLEU

if __package__:
    from .corpus import die, read_lines
else:  # run as a file by the recipes (no package import: it would load fairseq and torch)
    from corpus import die, read_lines  # one reader: UTF-8 checked, BOM/CR cleaned  (one reader: UTF-8 checked, BOM/CR cleaned)


def read(path):
    return list(read_lines(path))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hyp-detok", required=True)
    p.add_argument("--ref-detok", required=True)
    p.add_argument("--hyp-tok")
    p.add_argument("--ref-tok")
    p.add_argument("--json", help="also write the scores here")
    p.add_argument("--headline", help="flavour to repeat last as the task's reported metric")
    p.add_argument("--headline-note", default="")
    args = p.parse_args()

    jobs = [("detok-cased", args.hyp_detok, args.ref_detok, "13a", False),
            ("detok-lc", args.hyp_detok, args.ref_detok, "13a", True)]
    if args.hyp_tok and args.ref_tok:
        jobs += [("tok-cased", args.hyp_tok, args.ref_tok, "none", False),
                 ("tok-lc", args.hyp_tok, args.ref_tok, "none", True)]

    results = {}
    for name, hyp_path, ref_path, tok, lc in jobs:
        hyps, refs = read(hyp_path), read(ref_path)
        if len(hyps) != len(refs):
            die(f"{hyp_path} has {len(hyps)} lines but {ref_path} has {len(refs)}")
        # force: the tok flavours are tokenized on purpose (no "forgot to detokenize" nag)
        bleu = BLEU(tokenize=tok, lowercase=lc, force=(tok == "none"))
        score = bleu.corpus_score(hyps, [refs])
        sig = str(bleu.get_signature())
        line = score.format(signature=sig)
        results[name] = {"score": round(score.score, 2), "signature": sig, "line": line,
                         "hyp": hyp_path, "ref": ref_path}
        print(f"{name:<12} {line}")
    if args.headline and args.headline in results:
        r = results[args.headline]
        note = f" ({args.headline_note})" if args.headline_note else ""
        print(f"reported BLEU [{args.headline}]{note}: {r['score']:.2f}  signature: {r['signature']}")
        results["headline"] = args.headline
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
