"""Translate your own raw text with a trained model: one line in, one line out.

    fairseq-ext translate --checkpoint CKPT --data DATA_BIN [--input FILE] [--output FILE]
                          [--beam 5] [--lenpen 1.0] [--max-len-a 1.2 --max-len-b 10] [--cpu]

The data directory's ``prep.env`` (written by the data recipes) says how the training text
was made, and each input line goes through the same steps: Moses tokenization with the
recipe's options, lower-casing where the recipe lower-cased, subword-nmt BPE (DATA/code) or
SentencePiece (DATA/spm.model), the dictionary. The best beam hypothesis comes out with its
subword units joined and Moses-detokenized: plain text, comparable with a raw reference
(``sacrebleu REF -i OUT``). Without ``prep.env`` (data binarized with plain
fairseq-preprocess) every line is taken as the model's tokens, and the output is tokens too.

- an empty input line gives an empty output line (the model is not asked: a model given no
  words invents a sentence);
- a line longer than the model's source positions is cut to them, with a warning naming
  the line;
- input that is not UTF-8 stops with one line naming the line and byte.
Loading goes through the plugin's checkpoint guards, as everywhere.
"""
import argparse
import logging
import sys
from typing import Iterable, Iterator, List

import torch

from fairseq_ext.errors import FairseqExtError

logger = logging.getLogger("fairseq_ext.translate")


def read_input(stream) -> Iterator[str]:
    """Lines as every tool reads them (UTF-8 checked, BOM and CRs removed)."""
    from fairseq_ext.tools.corpus import clean_line

    name = getattr(stream, "name", "<stdin>")
    for number, raw in enumerate(stream, start=1):
        yield clean_line(raw, name, number)


class Translator:
    """A checkpoint, its data directory's text pipeline and fairseq's SequenceGenerator."""

    def __init__(self, checkpoint: str, data: str, beam: int = 5, lenpen: float = 1.0, max_len_a: float = 1.2,
                 max_len_b: int = 10, cpu: bool = False):
        from fairseq_ext.analysis import common
        from fairseq_ext.analysis.probing import TextPipeline
        from fairseq_ext.tools.corpus import moses_detokenizer
        from fairseq_ext.tools.evaluate import read_prep_env

        self.model, self.task = common.load_model(checkpoint, data, cpu=cpu)
        if getattr(self.task.cfg, "extra_source_langs", None):
            raise FairseqExtError("--checkpoint: a multi-source model reads several sources; "
                                  "translate it with fairseq-ext evaluate on a prepared split")
        self.env = read_prep_env(data)
        self.src_dict, self.tgt_dict = self.task.source_dictionary, self.task.target_dictionary
        self.pipeline = TextPipeline(data, self.src_dict, max_positions=None)
        max_positions = self.model.max_positions()
        self.max_source = max_positions[0] if isinstance(max_positions, tuple) else max_positions
        gen_args = argparse.Namespace(beam=beam, lenpen=lenpen, max_len_a=max_len_a, max_len_b=max_len_b)
        self.generator = self.task.build_generator([self.model], gen_args)
        self.device = next(self.model.parameters()).device
        # the subword kind as the text pipeline and evaluation read it (subword-nmt unless prep.env
        # says otherwise; none without prep.env)
        self.bpe = self.env.get("bpe", "subword_nmt") if self.env else "none"
        self.detokenize = moses_detokenizer(self.env.get("tgt", "en")) if self.env else None

    def encode(self, number: int, line: str) -> torch.Tensor:
        from fairseq_ext.analysis.probing import within_positions

        ids = self.pipeline(line)
        if self.max_source is not None and ids.numel() > self.max_source:
            logger.warning(f"line {number}: {ids.numel()} source tokens, more than the model's "
                           f"{self.max_source} positions: cut to them")
        return within_positions(ids, self.max_source)

    def decode(self, tokens: torch.Tensor) -> str:
        post = {"subword_nmt": "subword_nmt", "subword-nmt": "subword_nmt",
                "sentencepiece": "sentencepiece"}.get(self.bpe)
        text = self.tgt_dict.string(tokens.int().cpu(), post)
        if self.detokenize is not None:
            text = self.detokenize(text)
        return text

    @torch.no_grad()
    def translate_batch(self, batch: List[torch.Tensor]) -> List[str]:
        from fairseq.data import data_utils

        pad, eos = self.src_dict.pad(), self.src_dict.eos()
        left_pad = getattr(self.task.cfg, "left_pad_source", True)
        tokens = data_utils.collate_tokens(batch, pad, eos, left_pad=left_pad).to(self.device)
        lengths = torch.tensor([b.numel() for b in batch], device=self.device)
        sample = {"net_input": {"src_tokens": tokens, "src_lengths": lengths}, "id": torch.arange(len(batch))}
        hypos = self.task.inference_step(self.generator, [self.model], sample)
        return [self.decode(h[0]["tokens"]) for h in hypos]

    def translate(self, lines: Iterable[str], batch_size: int = 32, buffer_batches: int = 16) -> Iterator[str]:
        """Translations in input order. Up to ``buffer_batches`` batches of lines are read at a
        time and batched by length (less padding, as fairseq-generate does); an empty line
        gives an empty translation without asking the model."""
        buffer: List[tuple] = []
        for number, line in enumerate(lines, start=1):
            buffer.append((number, line))
            if len(buffer) == batch_size * buffer_batches:
                yield from self._translate_buffer(buffer, batch_size)
                buffer = []
        yield from self._translate_buffer(buffer, batch_size)

    def _translate_buffer(self, buffer, batch_size):
        encoded = {i: self.encode(number, line) for i, (number, line) in enumerate(buffer) if line.strip()}
        order = sorted(encoded, key=lambda i: encoded[i].numel())
        out = [""] * len(buffer)
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            for i, text in zip(chunk, self.translate_batch([encoded[i] for i in chunk])):
                out[i] = text
        yield from out


def main(argv=None):
    from fairseq_ext.analysis.common import setup_cli

    setup_cli()
    logging.getLogger("fairseq_ext.translate").setLevel(logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--data", required=True, help="the binarized data the model was trained on "
                        "(its dictionaries, prep.env, BPE codes)")
    parser.add_argument("--input", help="raw text, one sentence per line (default: standard input)")
    parser.add_argument("--output", help="translations, one per line (default: standard output)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--lenpen", type=float, default=1.0)
    parser.add_argument("--max-len-a", type=float, default=1.2)
    parser.add_argument("--max-len-b", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    args = parser.parse_args(argv)
    for name in ("beam", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    translator = Translator(args.checkpoint, args.data, beam=args.beam, lenpen=args.lenpen,
                            max_len_a=args.max_len_a, max_len_b=args.max_len_b, cpu=args.cpu)
    source = open(args.input, "rb") if args.input else sys.stdin.buffer
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        for text in translator.translate(read_input(source), batch_size=args.batch_size):
            out.write(text + "\n")
            out.flush()
    finally:
        if args.input:
            source.close()
        if args.output:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
