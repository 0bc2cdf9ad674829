#!/usr/bin/env python3
"""sacreBLEU in the four flavours the papers use, with signatures (evaluation's scorer), and chrF, chrF++ and TER on the
text of the reported flavour (:func:`more_metrics`).

detok  cased : detokenized text, tokenize 13a, case-sensitive   (WMT'14, En-Vi, Multi30k) detok  lc    : the same,
lowercased (-lc) tok    cased : Moses-tokenized text, --tokenize none             (multi-bleu.perl style: tok    lc    :
the same, lowercased                              Es-En, Fr, Ro; De-En lc)

Usage:
  bleu.py --hyp-detok H --ref-detok R [--hyp-tok H --ref-tok R] [--json OUT]
                [--headline detok-cased|detok-lc|tok-cased|tok-lc]
"""
import argparse
import json

from sacrebleu.metrics import BLEU, CHRF, TER

if __package__:
    from .corpus import TextError, die, read_lines, unescape_moses
else:  # run as a file (it imports nothing outside standalone/)
    from corpus import TextError, die, read_lines, unescape_moses  # one reader: UTF-8 checked, BOM/CR cleaned


def _scored(scorer, hyps, refs):
    """(score rounded to 2 decimals, signature, sacreBLEU's line) of ``scorer`` on the texts."""
    corpus = scorer.corpus_score(hyps, [refs])
    sig = str(scorer.get_signature())
    return round(corpus.score, 2), sig, corpus.format(signature=sig)


def score(hyp_detok, ref_detok, hyp_tok=None, ref_tok=None):
    """sacreBLEU of the files in each flavour: {flavour: {score, signature, line, hyp, ref}}."""
    jobs = [("detok-cased", hyp_detok, ref_detok, "13a", False), ("detok-lc", hyp_detok, ref_detok, "13a", True)]
    if hyp_tok and ref_tok:
        jobs += [("tok-cased", hyp_tok, ref_tok, "none", False), ("tok-lc", hyp_tok, ref_tok, "none", True)]
    results = {}
    for name, hyp_path, ref_path, tok, lc in jobs:
        hyps, refs = list(read_lines(hyp_path)), list(read_lines(ref_path))
        if len(hyps) != len(refs):
            raise TextError(f"{hyp_path} has {len(hyps)} lines but {ref_path} has {len(refs)}")
        # force: the tok flavours are tokenized on purpose (no "forgot to detokenize" nag)
        score_, sig, line = _scored(BLEU(tokenize=tok, lowercase=lc, force=(tok == "none")), hyps, refs)
        results[name] = {"score": score_, "signature": sig, "line": line, "hyp": hyp_path, "ref": ref_path}
    return results


# beside BLEU, on the text of the reported flavour: chrF (character 6-grams, beta 2), chrF++
# (plus word bigrams) and TER; case-insensitive for a lowercased flavour
_SCORERS = {"chrF2": lambda lc: CHRF(lowercase=lc), "chrF2++": lambda lc: CHRF(word_order=2, lowercase=lc),
            "TER": lambda lc: TER(case_sensitive=not lc)}
METRICS = tuple(_SCORERS)


def metric(name, lowercase):
    """The sacreBLEU scorer of the metric ``name`` (one of :data:`METRICS`)."""
    if name not in _SCORERS:
        raise ValueError(f"unknown metric {name!r} (one of {', '.join(METRICS)})")
    return _SCORERS[name](lowercase)


def more_metrics(results, flavour):
    """chrF2, chrF2++ and TER of the files of ``flavour`` (a key of :func:`score`'s ``results``):
    {metric: {score, signature, line, flavour}}."""
    r = results[flavour]
    hyps, refs = list(read_lines(r["hyp"])), list(read_lines(r["ref"]))
    if flavour.startswith("tok"):  # Moses-tokenized text carries XML escapes: chrF and TER read the characters
        hyps, refs = [unescape_moses(h) for h in hyps], [unescape_moses(x) for x in refs]
    out = {}
    for name in METRICS:
        score_, sig, line = _scored(metric(name, flavour.endswith("-lc")), hyps, refs)
        out[name] = {"score": score_, "signature": sig, "flavour": flavour, "line": line}
    return out


def metric_lines(metrics):
    """One line a metric: ``chrF2 [detok-cased]  chrF2|nrefs:1|... = 58.32``."""
    return [f"{name + ' [' + m['flavour'] + ']':<25} {m['line']}" for name, m in metrics.items()]


def report(results, headline=None, headline_note=""):
    """The printed lines: one per flavour, then ``headline`` (also recorded in ``results``)."""
    lines = [f"{name:<12} {r['line']}" for name, r in results.items() if isinstance(r, dict)]
    if headline and headline in results:
        r = results[headline]
        note = f" ({headline_note})" if headline_note else ""
        lines.append(f"reported BLEU [{headline}]{note}: {r['score']:.2f}  signature: {r['signature']}")
        results["headline"] = headline
    return lines


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

    try:
        results = score(args.hyp_detok, args.ref_detok, args.hyp_tok, args.ref_tok)
    except TextError as e:
        die(str(e))
    lines = report(results, args.headline, args.headline_note)
    flavour = results.get("headline", "detok-cased")
    for line in lines[:-1] + metric_lines(more_metrics(results, flavour)) + lines[-1:]:
        print(line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
