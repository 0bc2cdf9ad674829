#!/usr/bin/env python3
"""Text helpers of the data recipes (``fairseq-ext prepare``) and of evaluation.

Each subcommand is a small filter; files ending in .gz are read transparently.

  cat FILE...                the files as clean text: UTF-8 checked (an invalid line is an
                             error naming the file and line), a leading BOM dropped, CR LF
                             and a lone CR inside a line made \n and a space (so that wc -l,
                             Python and fairseq agree on the lines)
  check-parallel A B         both files exist, are non-empty and have equal line counts
  tokenize -l LANG           Moses tokenization (sacremoses), stdin -> stdout
  detokenize -l LANG         Moses detokenization, also undoes the XML escapes
  lowercase                  lowercase stdin -> stdout
  strip-tags                 IWSLT train.tags.*: drop the <url>/<talkid>/... lines, keep text
  extract-segs FILE          IWSLT .xml / WMT .sgm: the text of every <seg ...> element
  clean SRC TGT OUT_SRC OUT_TGT
                             Moses clean-corpus-n: drop empty/too long/too unbalanced pairs
  split IN_SRC IN_TGT ...    hold out lines of a parallel corpus (every n-th or a random sample)
  head N IN OUT              first N lines (N <= 0: all lines)
  extract-gen GEN OUT_DIR    fairseq-generate output -> hyp/ref/src files in input order

Every error goes to stderr as one line, "PROG: error: ..." (PROG: $FSX_PROG, the script
that called; "error: ..." without it), and exits non-zero. Called from Python, the readers
raise :class:`TextError` instead, for the caller to report.
"""
import argparse
import gzip
import io
import os
import random
import re
import sys

if __package__:
    from .moses import moses_detokenizer, tokenize_lines
else:  # run as a file by the recipes (it imports nothing outside standalone/)
    from moses import moses_detokenizer, tokenize_lines


class TextError(Exception):
    """A text file that cannot be read as the recipes need it; the message names the file."""


# the XML escapes of the Moses tokenizer (&quot; for ", ...), in the order that undoes them
MOSES_ESCAPES = [("&bar;", "|"), ("&#124;", "|"), ("&lt;", "<"), ("&gt;", ">"), ("&bra;", "["), ("&ket;", "]"),
                 ("&#91;", "["), ("&#93;", "]"), ("&quot;", '"'), ("&apos;", "'"), ("&amp;", "&")]


def unescape_moses(text: str) -> str:
    for entity, char in MOSES_ESCAPES:
        text = text.replace(entity, char)
    return text


def die(msg):
    prog = os.environ.get("FSX_PROG")
    print(f"{prog}: error: {msg}" if prog else f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def open_text(path, mode="w"):
    """A file to write text to (UTF-8, LF line ends; .gz compressed)."""
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, mode.replace("t", "") + "b"), encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


def write_lines(path, lines):
    """Write ``lines`` to ``path`` (open_text), one a line."""
    with open_text(path) as f:
        f.writelines(line + "\n" for line in lines)


def clean_line(raw: bytes, path: str, number: int) -> str:
    """One line of a corpus file as text: UTF-8 (else an error naming the file and line), without
    its line end, a BOM at the start of the file, or a CR (inside the line: a space, since
    Python's universal newlines would split the line there, wc -l would not)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TextError(f"{path}: line {number} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
    if number == 1 and line.startswith("\ufeff"):
        line = line[1:]
    line = line.rstrip("\n")
    if line.endswith("\r"):
        line = line[:-1]
    return line.replace("\r", " ")


def read_lines(path: str):
    """The lines of a plain or gzipped corpus file, cleaned by clean_line."""
    if not os.path.exists(path):
        raise TextError(f"missing file: {path}")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for number, raw in enumerate(f, start=1):  # binary: split on \n only, as wc -l
                yield clean_line(raw, path, number)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise TextError(f"cannot read {path}: {e}")


def cmd_cat(args):
    write_stdout(line for path in args.files for line in read_lines(path))


def stdin_lines():
    """The lines of standard input, cleaned by clean_line like a file's."""
    for number, raw in enumerate(sys.stdin.buffer, start=1):  # binary: split on LF only, as wc -l
        yield clean_line(raw, "<standard input>", number)


def write_stdout(lines):
    out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n", line_buffering=False)
    out.writelines(line + "\n" for line in lines)
    out.flush()


def count_lines(path):
    return sum(1 for _ in read_lines(path))


# ----------------------------------------------------------------------------- check
def check_parallel(paths):
    """The line count of the files, which must be equal and non-zero."""
    counts = [count_lines(p) for p in paths]
    for path, n in zip(paths, counts):
        if n == 0:
            raise TextError(f"empty corpus: {path} has no lines")
    if len(set(counts)) != 1:
        detail = ", ".join(f"{p} has {n}" for p, n in zip(paths, counts))
        raise TextError(f"mismatched line counts between the sides of a parallel corpus: {detail}")
    return counts[0]


def cmd_check_parallel(args):
    n = check_parallel(args.files)
    if args.print_count:
        print(n)


def cmd_tokenize(args):
    options = (args.lang, args.aggressive, not args.no_escape, args.lowercase, args.normalize)
    write_stdout(tokenize_lines(stdin_lines(), options, args.workers))


def cmd_detokenize(args):
    write_stdout(map(moses_detokenizer(args.lang), stdin_lines()))


def cmd_lowercase(args):
    write_stdout(line.lower() for line in stdin_lines())


# ----------------------------------------------------------------------------- IWSLT/WMT formats
_TAG_LINE = re.compile(r"^\s*<(url|talkid|keywords|speaker|reviewer|translator|doc|/doc|"
                       r"seg|/seg|refset|/refset|srcset|/srcset|mteval|/mteval|head|/head)\b")
_INLINE_TAGS = re.compile(r"</?(title|description)>")


def cmd_strip_tags(args):
    """Same filter as fairseq's prepare-iwslt14.sh for the train.tags.* files."""
    write_stdout(_INLINE_TAGS.sub("", line).strip() for line in stdin_lines() if not _TAG_LINE.match(line))


_SEG = re.compile(r"<seg[^>]*>(.*?)</seg>", re.I)


def cmd_extract_segs(args):
    segs = [m.group(1).strip().replace("\u2019", "'") for m in map(_SEG.search, read_lines(args.file)) if m]
    write_stdout(segs)
    if not segs:
        die(f"no <seg> elements in {args.file}: not an IWSLT .xml / WMT .sgm file?")


# ----------------------------------------------------------------------------- clean / split / head
def cmd_clean(args):
    kept = dropped = 0
    with open_text(args.out_src) as os_, open_text(args.out_tgt) as ot:
        for s, t in zip(read_lines(args.src), read_lines(args.tgt)):
            s, t = " ".join(s.split()), " ".join(t.split())
            ns, nt = len(s.split()), len(t.split())
            if (ns < args.min or nt < args.min or ns > args.max or nt > args.max
                    or ns / max(nt, 1) > args.ratio or nt / max(ns, 1) > args.ratio):
                dropped += 1
                continue
            os_.write(s + "\n")
            ot.write(t + "\n")
            kept += 1
    print(f"clean: kept {kept} pairs, dropped {dropped}", file=sys.stderr)
    if kept == 0:
        die(f"empty corpus: no pair of {args.src} / {args.tgt} survived cleaning")


def cmd_split(args):
    """Write the held-out lines to --heldout-* and the rest to --rest-*, in input order."""
    n = count_lines(args.src)
    if args.every:
        held = {i for i in range(n) if (i + 1) % args.every == 0}
    else:
        k = min(args.size, n // 10) if n < 10 * args.size else args.size
        if k <= 0:
            die(f"corpus {args.src} has {n} lines: too few to hold out a dev set")
        held = set(random.Random(args.seed).sample(range(n), k))
    with open_text(args.rest_src) as rs, open_text(args.rest_tgt) as rt, \
            open_text(args.heldout_src) as hs, open_text(args.heldout_tgt) as ht:
        for i, (s, t) in enumerate(zip(read_lines(args.src), read_lines(args.tgt))):
            out_src, out_tgt = (hs, ht) if i in held else (rs, rt)
            out_src.write(s + "\n")
            out_tgt.write(t + "\n")
    print(f"split: held out {len(held)} of {n} lines", file=sys.stderr)


def cmd_head(args):
    with open_text(args.output) as out:
        for i, line in enumerate(read_lines(args.input)):
            if 0 < args.n <= i:
                break
            out.write(line + "\n")


# ----------------------------------------------------------------------------- fairseq-generate
def parse_generate(path):
    """fairseq-generate's H-/T-/S- lines by sentence id: lists ``hyp``, ``ref``, ``src`` ("" where missing)."""
    hyps, refs, srcs = {}, {}, {}
    for line in read_lines(path):
        m = re.match(r"^([STH])-(\d+)\t(.*)$", line)
        if not m:
            continue
        kind, idx, rest = m.group(1), int(m.group(2)), m.group(3)
        if kind == "H":
            hyps[idx] = rest.split("\t", 1)[1] if "\t" in rest else ""
        elif kind == "T":
            refs[idx] = rest
        else:
            srcs[idx] = rest
    if not hyps:
        raise TextError(f"no hypotheses (H- lines) in {path}: did fairseq-generate fail?")
    ids = sorted(hyps)
    if ids != list(range(len(ids))):
        raise TextError(f"{path}: hypotheses for sentence ids {sorted(set(range(max(ids) + 1)) - set(ids))[:5]}"
            " are missing")
    return {name: [table.get(i, "") for i in ids] for name, table in (("hyp", hyps), ("ref", refs), ("src", srcs))}


def cmd_extract_gen(args):
    lines = parse_generate(args.gen)
    os.makedirs(args.out_dir, exist_ok=True)
    for name, rows in lines.items():
        write_lines(os.path.join(args.out_dir, f"gen.{name}"), rows)
    print(len(lines["hyp"]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def command(name, fn, *arguments):
        """Each argument: ("NAME" or "-x --xx", its add_argument options)."""
        s = sub.add_parser(name)
        for names, options in arguments:
            s.add_argument(*names.split(), **options)
        s.set_defaults(fn=fn)
        return s

    files, lang, flag = ("files", {"nargs": "+"}), ("-l --lang", {"required": True}), {"action": "store_true"}
    command("cat", cmd_cat, files)
    command("check-parallel", cmd_check_parallel, files, ("--print-count", flag))
    command("tokenize", cmd_tokenize, lang, ("-a --aggressive", dict(flag, help="Moses -a (split hyphens)")),
            ("--no-escape", dict(flag, help="do not XML-escape (Moses -no-escape)")), ("--lowercase", flag),
            ("--normalize", dict(flag, help="Moses normalize-punctuation first")),
            ("--workers", {"type": int, "default": 1}))
    command("detokenize", cmd_detokenize, lang)
    command("lowercase", cmd_lowercase)
    command("strip-tags", cmd_strip_tags)
    command("extract-segs", cmd_extract_segs, ("file", {}))
    command("clean", cmd_clean, *((name, {}) for name in ("src", "tgt", "out_src", "out_tgt")),
            ("--min", {"type": int, "default": 1}), ("--max", {"type": int, "default": 175}),
            ("--ratio", {"type": float, "default": 1.5}))
    s = command("split", cmd_split, ("src", {}), ("tgt", {}), ("--seed", {"type": int, "default": 1}),
                *((f"--{name}", {"required": True}) for name in ("rest-src", "rest-tgt", "heldout-src", "heldout-tgt")))
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--every", type=int, help="hold out every n-th line")
    g.add_argument("--size", type=int, help="hold out a random sample of this many lines")
    command("head", cmd_head, ("n", {"type": int}), ("input", {}), ("output", {}))
    command("extract-gen", cmd_extract_gen, ("gen", {}), ("out_dir", {}))

    args = p.parse_args()
    try:
        args.fn(args)
    except TextError as e:
        die(str(e))
    except BrokenPipeError:
        sys.exit(1)


if __name__ == "__main__":
    main()
