"""The recipes' Moses tokenization and detokenization (sacremoses), as functions of one line and
as a pool of tokenizer processes; the one implementation the recipes (corpus.py tokenize /
detokenize) and the package's Python code (evaluation, METEOR, translation) share."""
import itertools
import multiprocessing

_TOK = None  # the tokenizer of a pool process


def moses_tokenizer(lang, aggressive=False, escape=True, lowercase=False, normalize=False):
    """The recipes' Moses tokenization of one line, as a function."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    # normalize-punctuation.perl + remove-non-printing-char.perl, as fairseq's WMT recipes
    norm = MosesPunctNormalizer(lang=lang, post_remove_control_chars=True) if normalize else None

    def run(line):
        if norm is not None:
            line = norm.normalize(line)
        out = tok.tokenize(line, aggressive_dash_splits=aggressive, return_str=True, escape=escape)
        out = " ".join(out.split())
        return out.lower() if lowercase else out

    return run


def _init_tok(*options):
    global _TOK
    _TOK = moses_tokenizer(*options)


def _tok_chunk(lines):
    return [_TOK(line) for line in lines]


def tokenize_lines(lines, options, workers=1):
    """``lines`` tokenized by :func:`moses_tokenizer` (``options``: its arguments), in order;
    with ``workers`` > 1 by a pool of processes."""
    if workers <= 1:
        tok = moses_tokenizer(*options)
        yield from (tok(line) for line in lines)
        return
    with multiprocessing.Pool(workers, initializer=_init_tok, initargs=options) as pool:
        lines = iter(lines)
        for chunk in pool.imap(_tok_chunk, iter(lambda: list(itertools.islice(lines, 2000)), [])):
            yield from chunk


def moses_detokenizer(lang):
    """The Moses detokenization of one line (XML escapes undone), as a function."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return lambda line: detok.detokenize(line.split(), return_str=True, unescape=True)
