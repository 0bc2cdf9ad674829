"""Translate your own raw text with a trained model: one line in, one line out.

    fairseq-ext translate --checkpoint CKPT --data DATA_BIN [--input FILE] [--output FILE]
                          [--beam 5] [--lenpen 1.0] [--max-len-a 1.2 --max-len-b 10] [--cpu]
                          [--strict] [--progress | --no-progress]

The data directory's ``prep.env`` (written by the data recipes) says how the training text was made, and each input line
goes through the same steps: Moses tokenization with the recipe's options, lower-casing where the recipe lower-cased,
subword-nmt BPE (DATA/code) or SentencePiece (DATA/spm.model), the dictionary. The best beam hypothesis comes out with
its subword units joined and Moses-detokenized: plain text, comparable with a raw reference (``fairseq-ext score``, or
``sacrebleu REF -i OUT``). Without ``prep.env`` (data binarized with plain fairseq-preprocess) every line is taken as
the model's tokens, and the output is tokens too.

Bad input never ends the run, and output line N always belongs to input line N:
- an empty input line, or one with no words (only spaces, control or zero-width characters
  such as NUL or U+200B), gives an empty output line (the model is not asked: a model given
  no words invents a sentence);
- a line that is not UTF-8 is skipped with one warning naming the line and the byte, and an
  empty output line takes its place (--strict: it is an error, exit status 1);
- a line longer than the model's source positions is cut to them, with one warning naming
  the line.
At the end, one summary line on stderr: lines translated, skipped (their numbers), cut.
A progress bar (lines done of the total, sentences per second) goes to stderr when stderr is
a terminal (--progress: always, --no-progress: never); stdout holds the translations only.
Loading goes through the plugin's checkpoint guards, as everywhere.
"""
import argparse
import contextlib
import gzip
import io
import logging
import os
import sys
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from fairseq_ext.common import checkpoints
from fairseq_ext.common.command_line import search_arguments, setup_cli
from fairseq_ext.common.data_text import POSTPROCESS, TextPipeline, read_prep_env, within_positions
from fairseq_ext.common.output_file import check_output_file, staged_output_file
from fairseq_ext.errors import FairseqExtError
from fairseq_ext.standalone.corpus import TextError, clean_line
from fairseq_ext.standalone.moses import moses_detokenizer

logger = logging.getLogger("fairseq_ext.translate")

PROG = "fairseq-ext translate"
STDIN = "<standard input>"
FIRST_FEW = 5  # line numbers named in the summary


class InputError(FairseqExtError):
    """Input text that cannot be used: a line that is not UTF-8 under --strict, a reference
    line that is not UTF-8, files that are not parallel."""


def read_input(stream, name: Optional[str] = None, strict: str = "") -> Iterator[Optional[str]]:
    """The lines of a binary stream, cleaned by corpus.clean_line. A line that is not UTF-8 comes out as None after one
    warning; with ``strict`` it is an InputError instead, ``strict`` the message with {} for clean_line's words."""
    name = name or getattr(stream, "name", STDIN)
    for number, raw in enumerate(stream, start=1):  # binary: split on LF only, as wc -l
        try:
            yield clean_line(raw, name, number)
        except TextError as e:
            if strict:
                raise InputError(strict.format(e)) from None
            logger.warning(f"{e}: skipped, an empty output line in its place")
            yield None


_PIPED: dict = {}  # a pipe (``--input <(...)``) is read once: its bytes, for every later read


def open_binary(path: str):
    """A text file to read as bytes (.gz decompressed). A pipe, which can be read only once, is
    read once and kept, so that it can be counted and then read, as a file is."""
    if not os.path.isfile(path):
        if path not in _PIPED:
            with open(path, "rb") as f:
                _PIPED[path] = f.read()
        raw = io.BytesIO(_PIPED[path])
        return gzip.GzipFile(fileobj=raw, mode="rb") if path.endswith(".gz") else raw
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def check_input(flag: str, path: str) -> None:
    if os.path.isdir(path):
        raise InputError(f"{flag} {path} is a folder: name a file")
    if not os.path.exists(path):
        raise InputError(f"{flag} {path}: no such file")


def count_lines(path: str) -> int:
    """The lines read_input reads from the file; a file that cannot be read is an InputError."""
    try:
        with open_binary(path) as f:
            return sum(1 for _ in f)  # split on LF only, as read_input
    except (OSError, EOFError) as e:
        raise InputError(f"cannot read {path}: {e}") from None


def _first_few(numbers: List[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:FIRST_FEW])
    more = len(numbers) - FIRST_FEW
    return ("line " if len(numbers) == 1 else "lines ") + shown + (f" and {more} more" if more > 0 else "")


@dataclass
class Tally:
    lines: int = 0
    skipped: List[int] = field(default_factory=list)  # not UTF-8: an empty output line for each
    cut: List[int] = field(default_factory=list)  # longer than the model's source positions
    max_source: Optional[int] = None

    def summary(self, skipped_as: str = "an empty output line for each") -> str:
        done = self.lines - len(self.skipped)
        text = f"{done} line{'' if done == 1 else 's'} translated, {len(self.skipped)} skipped"
        if self.skipped:
            text += f" (not UTF-8: {_first_few(self.skipped)}; {skipped_as})"
        text += f", {len(self.cut)} cut"
        if self.cut:
            text += f" (longer than the model's {self.max_source} source positions: {_first_few(self.cut)})"
        return text


class Translator:
    """A checkpoint, its data directory's text pipeline and fairseq's SequenceGenerator."""

    def __init__(self, args: argparse.Namespace):
        self.model, self.task = checkpoints.load_model(args.checkpoint, args.data, cpu=args.cpu)
        if getattr(self.task.cfg, "extra_source_langs", None):
            raise FairseqExtError("--checkpoint: a multi-source model reads several sources; "
                                  "translate it with fairseq-ext evaluate on a prepared split")
        self.env = read_prep_env(args.data)
        self.src_dict, self.tgt_dict = self.task.source_dictionary, self.task.target_dictionary
        self.pipeline = TextPipeline(args.data, self.src_dict, max_positions=None, env=self.env)
        max_positions = self.model.max_positions()
        self.max_source = max_positions[0] if isinstance(max_positions, tuple) else max_positions
        gen_args = argparse.Namespace(beam=args.beam, lenpen=args.lenpen, max_len_a=args.max_len_a,
                                      max_len_b=args.max_len_b)
        self.generator = self.task.build_generator([self.model], gen_args)
        self.device = next(self.model.parameters()).device
        # the subword kind as the text pipeline and evaluation read it
        self.bpe = self.env.get("bpe", "subword_nmt") if self.env else "none"
        self._detokenizer = moses_detokenizer(self.env.get("tgt", "en")) if self.env else None

    def encode(self, number: int, line: str, tally: Tally) -> torch.Tensor:
        ids = self.pipeline(line)
        if self.max_source is not None and ids.numel() > self.max_source:
            logger.warning(f"line {number}: {ids.numel()} source tokens, more than the model's "
                           f"{self.max_source} positions: cut to them")
            tally.cut.append(number)
        return within_positions(ids, self.max_source)

    def detokenize(self, text: str) -> str:
        """Tokenized output as plain text (as it is without prep.env)."""
        return self._detokenizer(text) if self._detokenizer is not None and text else text

    @torch.no_grad()
    def translate_batch(self, batch: List[torch.Tensor]) -> List[str]:
        """The best hypothesis of each sentence as tokenized text: subword units joined, not
        detokenized (the recipe's tokenization, as in DATA/text/*.tok.*)."""
        from fairseq.data import data_utils

        pad, eos = self.src_dict.pad(), self.src_dict.eos()
        left_pad = getattr(self.task.cfg, "left_pad_source", True)
        tokens = data_utils.collate_tokens(batch, pad, eos, left_pad=left_pad).to(self.device)
        lengths = torch.tensor([b.numel() for b in batch], device=self.device)
        sample = {"net_input": {"src_tokens": tokens, "src_lengths": lengths}, "id": torch.arange(len(batch))}
        hypos = self.task.inference_step(self.generator, [self.model], sample)
        return [self.tgt_dict.string(h[0]["tokens"].int().cpu(), POSTPROCESS.get(self.bpe)) for h in hypos]

    def translate_tokenized(self, lines: Iterable[Optional[str]], batch_size: int, tally: Tally,
                            progress: Callable[[int], object], buffer_batches: int = 16) -> Iterator[str]:
        """Tokenized translations in input order, one per line, ``buffer_batches`` batches of lines read at a time and
        batched by length (less padding). An empty line, or one that could not be read (None), gives an empty
        translation without asking the model. ``progress(n)`` is called as n more lines are done."""
        tally.max_source = self.max_source
        buffer: List[tuple] = []
        for number, line in enumerate(lines, start=1):
            tally.lines += 1
            if line is None:
                tally.skipped.append(number)
            buffer.append((number, line))
            if len(buffer) == batch_size * buffer_batches:
                yield from self._translate_buffer(buffer, batch_size, tally, progress)
                buffer = []
        yield from self._translate_buffer(buffer, batch_size, tally, progress)

    def _translate_buffer(self, buffer, batch_size, tally, progress):
        encoded = {i: self.encode(number, line, tally) for i, (number, line) in enumerate(buffer)
                   if line is not None and has_words(line)}
        order = sorted(encoded, key=lambda i: encoded[i].numel())
        out = [""] * len(buffer)
        progress(len(buffer) - len(encoded))  # empty and skipped lines: nothing to ask the model
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            for i, text in zip(chunk, self.translate_batch([encoded[i] for i in chunk])):
                out[i] = text
            progress(len(chunk))
        yield from out


def has_words(line: str) -> bool:
    """Whether a line holds a character that is not white space, a control or format character
    (NUL, U+200B, a BOM, ...) or a surrogate: without one the model would invent a sentence."""
    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Cn") for ch in line)


# ----------------------------------------------------------------------------- command line
def parse_command(prog: str, doc: str, argv, files: Sequence[Tuple[str, dict]],
                  more: Callable[[argparse.ArgumentParser], None] = lambda parser: None) -> argparse.Namespace:
    """The command line of ``translate`` and ``score`` (``doc``: its help): --checkpoint, --data,
    the command's ``files`` (flag, add_argument's keywords), a Translator's options, then
    ``more``'s. Warnings and the summary go to stderr, one line each (:class:`_OneLine`)."""
    setup_cli()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine(prog))
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", required=True, help="the binarized data the model was trained on "
                        "(its dictionaries, prep.env, BPE codes)")
    for flag, keywords in files:
        parser.add_argument(flag, **keywords)
    search_arguments(parser, beam=5, lenpen=True, max_len=(1.2, 10))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    parser.add_argument("--strict", action="store_true", help="a source line that is not UTF-8 is an error "
                        "(default: it is skipped with a warning, an empty output line in its place)")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--progress", dest="progress", action="store_true", default=None,
                       help="show the progress bar on stderr (default: when stderr is a terminal)")
    shown.add_argument("--no-progress", dest="progress", action="store_false", help="never show it")
    parser.set_defaults(progress=None)
    more(parser)
    args = parser.parse_args(argv)
    for name in ("beam", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


class _OneLine(logging.Formatter):
    """``PROG: warning: message`` (warnings and errors), ``PROG: message`` (the rest)."""

    def __init__(self, prog: str):
        super().__init__()
        self.prog = prog

    def format(self, record):
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return f"{self.prog}: {level}{record.getMessage()}"


@contextlib.contextmanager
def progress_bar(show: Optional[bool], total: Optional[int] = None):
    """A tqdm bar on stderr, shown when ``show`` (None: when stderr is a terminal), the warnings
    written above it. Yields the bar's ``update``."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    show = sys.stderr.isatty() if show is None else show
    with tqdm(total=total, desc="translating", unit=" sentences", file=sys.stderr, disable=not show,
              dynamic_ncols=True) as bar, logging_redirect_tqdm(loggers=[logger]):
        yield bar.update


def main(argv=None):
    args = parse_command(PROG, __doc__, argv, [
        ("--input", {"help": "raw text, one sentence per line (default: standard input)"}),
        ("--output", {"help": "translations, one per line (default: standard output)"})])
    if args.input:
        check_input("--input", args.input)
    check_output_file(args.output, inputs={"--input": args.input}, checkpoints=args.checkpoint, data=args.data)
    total = count_lines(args.input) if args.input else None  # for the progress bar
    translator = Translator(args)
    tally = Tally()
    source = open_binary(args.input) if args.input else sys.stdin.buffer
    # --output: written beside the file and renamed at the end (a failed run leaves it as it was)
    staged = staged_output_file(args.output) if args.output else contextlib.nullcontext(sys.stdout)
    try:
        with staged as out, progress_bar(args.progress, total) as update:
            lines = read_input(source, args.input or STDIN, strict="{} (--strict)" if args.strict else "")
            for text in translator.translate_tokenized(lines, batch_size=args.batch_size, tally=tally, progress=update):
                out.write(translator.detokenize(text) + "\n")
                out.flush()
    finally:
        if args.input:
            source.close()
    logger.info(tally.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
