"""The data directory's text contract: a recipe writes ``DATA/prep.env`` (``key=value`` lines:
src, tgt, recipe, bpe, lowercase, test_set, ...) beside the binarized files, and ``DATA/code``
(subword-nmt) or ``DATA/spm.model`` (SentencePiece). Everything that reads a data directory reads
it here: prep.env, the BLEU flavour the papers report, the subword kinds, raw text -> source ids
(:class:`TextPipeline`) and the one text reader.
"""
import os
from typing import TYPE_CHECKING, Dict, List, Optional

from fairseq_ext.errors import DataError
from fairseq_ext.standalone import corpus, moses

if TYPE_CHECKING:  # reading prep.env and text needs no torch: evaluate and significance run without it
    import torch

# which BLEU the papers report for each task: (recipe, "src-tgt" or None for any) -> (flavour, note)
HEADLINES = (
    (("iwslt14", "de-en"), ("tok-lc", "IWSLT'14 De-En: lowercased, tokenized")),
    (("iwslt14", "en-de"), ("tok-lc", "IWSLT'14 De-En: lowercased, tokenized")),
    (("iwslt14", None), ("tok-cased", "IWSLT Es/Fr/Ro: multi-bleu style, tokenized")),
    (("iwslt-fr-ro", None), ("tok-cased", "IWSLT Es/Fr/Ro: multi-bleu style, tokenized")),
    (("iwslt15-en-vi", None), ("detok-cased", "IWSLT'15 En-Vi: sacreBLEU case-sensitive")),
    (("wmt14-en-de", None), ("detok-cased", "WMT'14: detokenized, case-sensitive, 13a")),
)
DEFAULT_HEADLINE = ("detok-cased", "detokenized, case-sensitive, 13a")
FLAVOURS = ("detok-cased", "detok-lc", "tok-cased", "tok-lc")
# a subword kind (prep.env's bpe=, evaluation's --bpe, both spellings of subword-nmt) ->
# fairseq-generate's --remove-bpe arguments
REMOVE_BPE = {"subword_nmt": ["--remove-bpe"], "subword-nmt": ["--remove-bpe"],
              "sentencepiece": ["--remove-bpe", "sentencepiece"], "none": []}
# a subword kind -> the post-processing name of fairseq's Dictionary.string (None: keep the units)
POSTPROCESS = {"subword_nmt": "subword_nmt", "subword-nmt": "subword_nmt", "sentencepiece": "sentencepiece"}
# the recipes' Moses options beyond the defaults (fairseq_ext/recipes/prepare-*.sh)
RECIPE_TOKENIZER = {"wmt14-en-de": {"normalize": True, "aggressive": True}}


def read_prep_env(data: str) -> Dict[str, str]:
    """DATA/prep.env's key=value lines (parsed, never run); {} for a directory without one."""
    prep = {}
    path = os.path.join(data, "prep.env")
    if os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.rstrip("\n").partition("=")
                if key and not key.startswith("#"):
                    prep[key] = value
    return prep


def headline_for(recipe: str, src: str, tgt: str, lowercase: bool = False):
    """(flavour, note): the BLEU the papers report for ``recipe``'s data in this direction; its
    lowercased form on lowercased data (a lowercase system against cased references says nothing)."""
    flavour, note = next((chosen for (r, pair), chosen in HEADLINES
                          if r == recipe and (pair is None or pair == f"{src}-{tgt}")), DEFAULT_HEADLINE)
    if lowercase and flavour.endswith("-cased"):
        flavour, note = flavour[: -len("cased")] + "lc", note + "; lowercased data (prep.env), so lowercased BLEU"
    return flavour, note


def env_headline(env: Dict[str, str], headline: str = ""):
    """(flavour, note) reported last: ``headline`` when given, else :func:`headline_for` prep.env's."""
    if headline:
        return headline, ""
    return headline_for(env.get("recipe", ""), env.get("src", ""), env.get("tgt", ""),
                        lowercase=env.get("lowercase") == "1")


def read_lines(path: str) -> List[str]:
    """corpus.read_lines as a list, its error a DataError."""
    try:
        return list(corpus.read_lines(path))
    except corpus.TextError as e:
        raise DataError(str(e)) from None


unescape_moses = corpus.unescape_moses


def recipe_tokenizer(lang: str, escape: bool, lowercase: bool = False, normalize: bool = False,
                     aggressive: bool = False):
    """The recipes' Moses tokenizer of a line, with the XML escapes of already tokenized text (a
    corpus released tokenized, such as IWSLT'15) undone first, so that none is escaped twice."""
    tok = moses.moses_tokenizer(lang, aggressive, escape, lowercase, normalize)
    return lambda line: tok(unescape_moses(line))


def side_tokenizer(env: Dict[str, str], side: str = "src"):
    """The recipe's Moses tokenization of one side (``src`` or ``tgt``) as DATA/text/*.tok.* was
    made; None without prep.env."""
    if not env:
        return None
    options = RECIPE_TOKENIZER.get(env.get("recipe", ""), {})
    return moses.moses_tokenizer(env.get(side, "en"), escape=True, lowercase=env.get("lowercase") == "1", **options)


def within_positions(ids: "torch.Tensor", max_positions: Optional[int]) -> "torch.Tensor":
    """A sentence's token ids (ending in </s>) cut to ``max_positions``, </s> kept."""
    if max_positions is not None and ids.numel() > max_positions:
        eos, ids = ids[-1], ids[:max_positions].clone()
        ids[-1] = eos
    return ids


class TextPipeline:
    """Raw or tokenized text -> the model's source token ids, as the recipe in DATA/prep.env
    made the training data: Moses tokenization, subword-nmt BPE (DATA/code) or SentencePiece
    (DATA/spm.model), the dictionary. Without prep.env the text is the model's tokens."""

    def __init__(self, data: str, dictionary, max_positions: Optional[int] = None,
                 env: Optional[Dict[str, str]] = None):
        self.dictionary, self.max_positions = dictionary, max_positions
        env = read_prep_env(data) if env is None else env
        self.description = "whitespace tokens (no DATA/prep.env)"
        self.tokenize = lambda line: line.strip()
        self.subword = lambda line: line
        if not env:
            return
        lang, lowercase = env.get("src", "en"), env.get("lowercase") == "1"
        options = RECIPE_TOKENIZER.get(env.get("recipe", ""), {})
        self.tokenize = recipe_tokenizer(lang, escape=True, lowercase=lowercase, **options)
        bpe = env.get("bpe", "subword_nmt")
        if POSTPROCESS.get(bpe) == "subword_nmt":
            codes = os.path.join(data, "code")
            if not os.path.exists(codes):
                raise DataError(f"--data {data}: prep.env says bpe={bpe} but {codes} is missing")
            from subword_nmt.apply_bpe import BPE

            with open(codes, encoding="utf-8") as f:
                applier = BPE(f)
            self.subword = lambda line: applier.process_line(line)
        elif bpe == "sentencepiece":
            path = os.path.join(data, "spm.model")
            if not os.path.exists(path):
                raise DataError(f"--data {data}: prep.env says bpe=sentencepiece but {path} is missing")
            import sentencepiece as spm

            sp = spm.SentencePieceProcessor(model_file=path)
            self.subword = lambda line: " ".join(sp.encode(line, out_type=str))
        self.description = f"Moses ({lang}{', ' + ', '.join(options) if options else ''}" \
                           f"{', lowercased' if lowercase else ''}) + {bpe}"

    def __call__(self, sentence: str) -> "torch.Tensor":
        line = self.subword(self.tokenize(sentence))
        ids = self.dictionary.encode_line(line, add_if_not_exist=False, append_eos=True).long()
        return within_positions(ids, self.max_positions)
