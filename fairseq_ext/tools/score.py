"""Translate a raw test set and score it with sacreBLEU, as ``fairseq-ext evaluate`` scores a prepared split: one
command, from raw source and raw reference to BLEU with signatures.

    fairseq-ext score --checkpoint CKPT --data DATA_BIN --src raw.en --ref raw.de
                      [--output hyp.de] [--headline FLAVOUR] [--beam 5] [--lenpen 1.0]
                      [--max-len-a 1.2 --max-len-b 10] [--cpu] [--strict] [--progress | --no-progress]

The source is translated as ``fairseq-ext translate`` translates it (the data directory's prep.env: tokenization,
lowercasing, BPE), with its warnings and its summary line: a source line that is not UTF-8 is skipped and scored as an
empty hypothesis (--strict: an error), a line longer than the model's positions is cut. Then sacreBLEU in the four
flavours of ``fairseq-ext evaluate`` (fairseq_ext/standalone/bleu.py), each with its signature:

  detok-cased, detok-lc  the detokenized translations against the raw reference (13a)
  tok-cased, tok-lc      the tokenized translations against the reference Moses-tokenized
                         as the recipe tokenized its data (lowercased where it lowercased),
                         --tokenize none

then chrF2, chrF2++ and TER (sacreBLEU's, with their signatures) on the text of the reported flavour, with --comet-model
COMET's system score on the raw source, the detokenized translations and the raw reference (lowercased for a lowercased
flavour; COMET runs in the Python of --comet-python, docs/evaluation.md), and last the reported one: the flavour
evaluate reports for the recipe in prep.env (a lowercased flavour on lowercased data), or --headline. Without prep.env
the output is the model's tokens, and every flavour compares it with the reference as given.

The source and the reference must have as many lines; a reference line that is not UTF-8 is
an error (a reference line cannot be skipped). Both are checked before the model loads.
--output keeps the translations (detokenized, one per source line).
"""
import os
import sys
import tempfile
from typing import List, Tuple

from fairseq_ext.common.data_text import FLAVOURS, env_headline, read_prep_env, side_tokenizer
from fairseq_ext.common.output_file import check_output_file, staged_output_file
from fairseq_ext.errors import DataError
from fairseq_ext.standalone import bleu
from fairseq_ext.standalone.corpus import write_lines
from fairseq_ext.tools import comet, translate
from fairseq_ext.tools.translate import InputError, logger

PROG = "fairseq-ext score"


def read_reference(path: str) -> List[str]:
    """The reference's lines; a line that is not UTF-8 is an InputError naming it."""
    try:
        with translate.open_binary(path) as f:
            return list(translate.read_input(f, path, strict="--ref {}: a reference line cannot be skipped"))
    except (OSError, EOFError) as e:
        raise InputError(f"--ref: cannot read {path}: {e}") from None


def score_lines(hyp_detok: List[str], ref_detok: List[str], hyp_tok: List[str], ref_tok: List[str],
                flavour: str = "detok-cased") -> Tuple[dict, dict]:
    """(bleu.score, bleu.more_metrics of ``flavour``) of the four texts, as evaluation scores files."""
    with tempfile.TemporaryDirectory(prefix="fairseq-ext-score.") as tmp:
        paths = [os.path.join(tmp, name) for name in ("hyp.detok", "ref.detok", "hyp.tok", "ref.tok")]
        for path, lines in zip(paths, (hyp_detok, ref_detok, hyp_tok, ref_tok)):
            write_lines(path, lines)
        results = bleu.score(*paths)
        return results, bleu.more_metrics(results, flavour)


def main(argv=None):
    args = translate.parse_command(PROG, __doc__, argv, [
        ("--src", {"required": True, "help": "raw source text, one sentence per line"}),
        ("--ref", {"required": True, "help": "raw reference, one sentence per source line"}),
        ("--output", {"help": "also write the translations here (detokenized, one per line)"}),
        ("--headline", {"choices": FLAVOURS, "help": "the flavour reported last (default: the one fairseq-ext "
                                                     "evaluate reports for the recipe in DATA/prep.env)"})],
        more=comet.add_arguments)

    # everything about the files before the model loads
    for flag, path in (("--src", args.src), ("--ref", args.ref)):
        translate.check_input(flag, path)
    check_output_file(args.output, inputs={"--src": args.src, "--ref": args.ref}, checkpoints=args.checkpoint,
                      data=args.data)
    refs = read_reference(args.ref)
    n_src = translate.count_lines(args.src)
    if n_src != len(refs):
        raise InputError(f"--src {args.src} has {n_src} lines but --ref {args.ref} has {len(refs)}: "
                         "they must be parallel, one reference line per source line")
    if n_src == 0:  # sacreBLEU would fail on an empty corpus with a traceback
        raise InputError(f"--src {args.src} and --ref {args.ref} are empty: nothing to score")
    comet_settings = comet.from_args(args)  # COMET's environment and model, before the model loads
    if not os.path.isdir(args.data):  # said alone, not after a warning about its prep.env
        raise DataError(f"--data {args.data}: no such directory")
    env = read_prep_env(args.data)
    headline, note = env_headline(env, args.headline or "")
    translator = translate.Translator(args)  # the checkpoint and the dictionaries: their errors come first
    if not env:
        logger.warning(f"no {os.path.join(args.data, 'prep.env')}: the translations are the model's tokens, "
                       "compared with the reference as given in every flavour")
    tally = translate.Tally()
    with translate.open_binary(args.src) as source, translate.progress_bar(args.progress, n_src) as update:
        # COMET reads the sources too
        sources = list(translate.read_input(source, args.src, strict="{} (--strict)" if args.strict else ""))
        hyp_tok = list(translator.translate_tokenized(sources, batch_size=args.batch_size, tally=tally,
                                                      progress=update))
    hyp_detok = [translator.detokenize(h) for h in hyp_tok]
    logger.info(tally.summary(skipped_as="each scored as an empty hypothesis"))
    if args.output:
        with staged_output_file(args.output) as f:
            f.writelines(line + "\n" for line in hyp_detok)
    # the reference tokenized as the recipe tokenized DATA/text/*.tok.TGT; as given without prep.env
    tokenize = side_tokenizer(env, "tgt") or (lambda line: line)
    results, metrics = score_lines(hyp_detok, refs, hyp_tok, [tokenize(r) for r in refs], headline)
    lines = bleu.report(results, headline, note)
    more = bleu.metric_lines(metrics)
    if comet_settings is not None:
        # the raw source (a line that is not UTF-8: empty, as its translation), as the data were cased
        src = [line or "" for line in sources]
        more += bleu.metric_lines({"COMET": comet.score(comet_settings, src, hyp_detok, refs,
                                                        lowercase=headline.endswith("-lc"))})
    for line in lines[:-1] + more + lines[-1:]:  # the reported BLEU line last
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
