"""The command skeleton of every analysis: its parser (the module docstring as description and
epilog, the arguments all of them take, and each option several of them take declared here
once) and :func:`run`, which parses a command line and hands the analysis its arguments and
the :class:`~fairseq_ext.analysis.figures.FigureContext` its figures name."""
import argparse
from typing import Callable, Dict, Optional

from fairseq_ext.analysis.figures import FigureContext
from fairseq_ext.common.command_line import setup_cli

HELP = {
    "--checkpoint": "model checkpoint(s)",
    "--names": "a name per checkpoint (default: the checkpoint's directory)",
    "--data": "binarized data directory (a fairseq-ext prepare output, or any fairseq-preprocess output)",
    "--split": None,
    "--out": "output directory (tables, JSON, CSV, PNG)",
    "--cpu": "run on the CPU even when a GPU is there",
}


class AnalysisParser(argparse.ArgumentParser):
    """An analysis command's parser: its module docstring's first paragraph as the
    description, the rest as the epilog, printed as written."""

    def __init__(self, doc: str, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1], **kwargs)


def common_arguments(parser, several: bool = True, overrides: Optional[Dict[str, dict]] = None,
                     checkpoint_group=None):
    """--checkpoint (one, or ``several``), --names, --data, --split, --out and --cpu;
    ``overrides``: option -> add_argument settings that differ for this command;
    ``checkpoint_group``: where --checkpoint goes (a mutually exclusive group)."""
    settings = {
        "--checkpoint": dict(nargs="+" if several else None, required=True,
                             help=HELP["--checkpoint"] if several else "model checkpoint"),
        "--names": dict(nargs="+", help=HELP["--names"]),
        "--data": dict(required=True, help=HELP["--data"]),
        "--split": dict(default="test"),
        "--out": dict(required=True, help=HELP["--out"]),
        "--cpu": dict(action="store_true", help=HELP["--cpu"]),
    }
    for option, changed in (overrides or {}).items():
        settings[option] = {**settings[option], **changed}
    for option, kwargs in settings.items():
        where = checkpoint_group if option == "--checkpoint" and checkpoint_group is not None else parser
        where.add_argument(option, **kwargs)
    return parser


def parser(doc: str, several: bool = True, max_sentences: bool = False,
           overrides: Optional[Dict[str, dict]] = None) -> AnalysisParser:
    """The parser of an analysis command (:class:`AnalysisParser`) with its
    :func:`common_arguments` and, with ``max_sentences``, --max-sentences."""
    ap = common_arguments(AnalysisParser(doc), several, overrides)
    if max_sentences:
        max_sentences_argument(ap)
    return ap


def max_sentences_argument(parser) -> None:
    parser.add_argument("--max-sentences", type=int, metavar="N",
                        help="analyse only the sentences of --split with ids below N (the N lowest ids)")


def language_arguments(parser) -> None:
    """--src/--tgt of the analyses that decode through fairseq-ext evaluate: needed only when
    neither DATA/prep.env, the checkpoint nor the data's file names tell the languages."""
    parser.add_argument("--src", help="source language (default: DATA/prep.env, the checkpoint, the data's file names)")
    parser.add_argument("--tgt", help="target language (default: as --src)")


def evaluation_arguments(parser, significance: bool = True, marks: str = "thesis") -> None:
    """What the analyses that decode through fairseq-ext evaluate take: --generate-args,
    --flavour, the languages and, with ``significance``, the paired bootstrap's --samples and
    --marks (default ``marks``)."""
    parser.add_argument("--generate-args", default="", help="fairseq-generate flags, e.g. '--beam 4 --lenpen 0.6'")
    parser.add_argument("--flavour", help="BLEU flavour (default: the one fairseq-ext evaluate reports for the data)")
    if significance:
        parser.add_argument("--samples", type=int, default=1000, help="paired bootstrap samples")
        parser.add_argument("--marks", default=marks, help="significance marks: thesis, mma or wt")
    language_arguments(parser)


def run(build_parser: Callable[[], argparse.ArgumentParser], execute: Callable, argv=None) -> int:
    """An analysis command: parse ``argv`` with ``build_parser()`` and run ``execute(args,
    figures)``, ``figures`` the :class:`FigureContext` of those arguments; its exit status 0
    unless ``execute`` returns another."""
    setup_cli()
    args = build_parser().parse_args(argv)
    return execute(args, FigureContext.of(args)) or 0
