#!/usr/bin/env python3
"""SentencePiece for the data recipes (`--bpe sentencepiece`).

train --model-prefix P --vocab-size N FILE...   joint BPE-type SentencePiece model encode --model P.model
stdin -> space-separated pieces decode --model P.model                          pieces -> text

The recipes feed it the (Moses-tokenized where needed) training text of both sides, so a
joint vocabulary results, as with subword-nmt.  fairseq-generate removes it with
`--remove-bpe sentencepiece`.
"""
import argparse

if __package__:
    from .corpus import TextError, die, stdin_lines, write_stdout
else:  # run as a file by the recipes (it imports nothing outside standalone/)
    from corpus import TextError, die, stdin_lines, write_stdout  # one-line errors; lines as wc -l counts them


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--model-prefix", required=True)
    t.add_argument("--vocab-size", type=int, required=True)
    t.add_argument("--character-coverage", type=float, default=1.0)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--max-sentences", type=int, default=2_000_000,
                   help="sample at most this many sentences for training")
    t.add_argument("files", nargs="+")
    for name in ("encode", "decode"):
        s = sub.add_parser(name)
        s.add_argument("--model", required=True)
    args = p.parse_args()

    import sentencepiece as spm

    if args.cmd == "train":
        try:
            spm.SentencePieceTrainer.train(
                input=",".join(args.files), model_prefix=args.model_prefix,
                vocab_size=args.vocab_size, model_type="bpe",
                character_coverage=args.character_coverage,
                # a tiny corpus (tests, --max-lines) cannot fill a large vocabulary
                hard_vocab_limit=False,
                input_sentence_size=args.max_sentences, shuffle_input_sentence=True,
                num_threads=args.threads,
                # fairseq adds its own <s> </s> <pad> <unk>
                bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0,
                minloglevel=2,
            )
        except RuntimeError as e:
            die(f"sentencepiece training failed: {e}")
        return
    try:
        sp = spm.SentencePieceProcessor(model_file=args.model)
    except (OSError, RuntimeError) as e:
        die(f"cannot load the SentencePiece model {args.model}: {e}")
    encode = args.cmd == "encode"
    try:
        write_stdout(" ".join(sp.encode(line, out_type=str)) if encode else sp.decode(line.split())
                     for line in stdin_lines())
    except TextError as e:
        die(str(e))


if __name__ == "__main__":
    main()
