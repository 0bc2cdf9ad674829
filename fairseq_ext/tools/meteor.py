"""METEOR without downloads, for the multi-source paper's tables (ms-1, ms-2).

Libovický et al. (2018) report "BLEU and METEOR as implemented in MultEval": METEOR 1.5
(Denkowski & Lavie 2014), a Java program run with its task "rank" settings, whose German,
French, Spanish and Czech scores also match paraphrases from tables of hundreds of MB that
come beside the jar, and whose English scores also match WordNet synonyms. None of that can
be fetched when the score is computed, so this module scores with the maintained Python
implementation instead, ``nltk.translate.meteor_score`` (nltk is pinned by the Makefile;
the version goes into every result), and keeps from METEOR 1.5 what needs no data:

  stages      exact, then stem (nltk's Snowball stemmer of the language: pure code, the
              Snowball algorithms METEOR 1.5 also stems with). No synonym stage: nltk's
              reads WordNet, a download, and gets a WordNet with no synsets here. No
              paraphrase stage: nltk has none. Czech is exact only, because METEOR 1.5 has
              no Czech stemmer either (its Czech stages are exact and paraphrase).
  parameters  METEOR 1.5's "rank" alpha, beta, gamma of the language (``LANGUAGES``; the
              jar prints them with ``-l LANG``), in nltk's formula
                  Fmean   = P * R / (alpha * P + (1 - alpha) * R)
                  penalty = gamma * (chunks / matches) ** beta
                  score   = Fmean * (1 - penalty)
              Not METEOR 1.5's delta: nltk has no function-word lists, so content and
              function words weigh the same (delta = 0.5); nor its module weights: a stem
              match counts as much as an exact one.
  tokens      the hypotheses and references are detokenized text; each line is
              Moses-tokenized for the language (sacremoses, no XML escapes, as
              ``fairseq_ext.recipes.helpers.corpus`` tokenizes) and lowercased by nltk.
  corpus      the mean of nltk's sentence scores, times 100. (METEOR 1.5 sums matches,
              chunks and lengths over the corpus and applies the formula once.)

nltk also aligns differently (greedily, where METEOR 1.5 searches for the alignment with the
fewest chunks). The score therefore tracks METEOR 1.5 but is not comparable with the paper's
to the last digit: see "METEOR" in docs/reproduction.md for how far apart they are on our
German outputs. Languages METEOR 1.5 has no tuned parameters for raise
:class:`MeteorUnavailable` instead of giving a number.

    python -m fairseq_ext.tools.meteor --hyp hyp.detok --ref ref.detok --lang de
"""
import argparse
import importlib.metadata
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional

from fairseq_ext.common.data_text import read_lines
from fairseq_ext.errors import FairseqExtError
from fairseq_ext.recipes.helpers.moses import moses_tokenizer
from fairseq_ext.tools.translate import InputError

NLTK_PIN = "nltk==3.10.4"  # the Makefile's pin, named in the error when nltk is missing


class MeteorUnavailable(FairseqExtError):
    """METEOR cannot be computed here for this language; the message says why."""


@dataclass(frozen=True)
class Language:
    """How one target language is scored: METEOR 1.5's "rank" parameters for it, the
    Snowball stemmer of its stem stage (None: no stem stage) and the METEOR 1.5 stages that
    need data and are left out."""

    name: str
    stemmer: Optional[str]
    alpha: float
    beta: float
    gamma: float
    left_out: str


LANGUAGES: Dict[str, Language] = {
    "cs": Language("Czech", None, 0.95, 0.2, 0.6, "paraphrase"),
    "de": Language("German", "german", 0.95, 1.0, 0.55, "paraphrase"),
    "en": Language("English", "english", 0.85, 0.2, 0.6, "synonym, paraphrase"),
    "es": Language("Spanish", "spanish", 0.65, 1.3, 0.5, "paraphrase"),
    "fr": Language("French", "french", 0.9, 1.4, 0.6, "paraphrase"),
}


class _NoSynsets:
    """A WordNet with no synsets: nltk's synonym stage matches nothing and reads no data."""

    def synsets(self, word, *args, **kwargs):
        return []


class _Unstemmed:
    """The stem stage of a language without a stemmer: a word is its own stem, so the stage
    adds no match beyond the exact ones."""

    def stem(self, word):
        return word


def _language(language: str) -> Language:
    if language not in LANGUAGES:
        raise MeteorUnavailable(
            f"METEOR for language {language!r} is unavailable: METEOR 1.5 has tuned parameters "
            f"only for {', '.join(sorted(LANGUAGES))}, and only those are scored here")
    return LANGUAGES[language]


def _nltk_version() -> str:
    try:
        return importlib.metadata.version("nltk")
    except importlib.metadata.PackageNotFoundError:
        raise MeteorUnavailable(f"METEOR is unavailable: nltk is not installed ({NLTK_PIN})") from None


def _stages(setup: Language) -> str:
    return f"exact+stem (Snowball {setup.stemmer})" if setup.stemmer else "exact"


def describe(language: str) -> str:
    """One line naming the implementation, stages and parameters used for ``language``, for
    table captions; for a language that cannot be scored, a line saying so and why."""
    try:
        setup, version = _language(language), _nltk_version()
    except MeteorUnavailable as err:
        return str(err)
    return (f"METEOR: nltk {version} meteor_score, {_stages(setup)}, no {setup.left_out}; "
            f"METEOR 1.5 rank alpha={setup.alpha} beta={setup.beta} gamma={setup.gamma}, no delta; "
            f"Moses-tokenized, lowercased; mean of sentence scores")


def corpus_score(hypotheses: List[str], references: List[str], language: str) -> dict:
    """METEOR of detokenized ``hypotheses`` against one reference each, on a 0-100 scale:
    ``{"score", "implementation", "language", "sentences"}``. Raises MeteorUnavailable for a
    language that cannot be scored, InputError for lists that are not parallel."""
    setup = _language(language)
    _nltk_version()
    implementation = describe(language)
    if len(hypotheses) != len(references):
        raise InputError(f"METEOR: {len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise InputError("METEOR: no sentences to score")
    from nltk.stem.snowball import SnowballStemmer
    from nltk.translate.meteor_score import single_meteor_score

    stemmer = SnowballStemmer(setup.stemmer) if setup.stemmer else _Unstemmed()
    tokenize = moses_tokenizer(language, escape=False)
    scores = [
        single_meteor_score(tokenize(ref).split(), tokenize(hyp).split(), stemmer=stemmer,
                            wordnet=_NoSynsets(), alpha=setup.alpha, beta=setup.beta,
                            gamma=setup.gamma)
        for hyp, ref in zip(hypotheses, references)
    ]
    return {"score": 100 * statistics.fmean(scores), "implementation": implementation,
            "language": language, "sentences": len(scores)}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_ext.tools.meteor",
                                description="METEOR of detokenized hypotheses against one reference "
                                            "each, computed offline (see the module's docstring).")
    p.add_argument("--hyp", required=True, help="hypotheses, detokenized, one per line")
    p.add_argument("--ref", required=True, help="references, detokenized, one per line")
    p.add_argument("--lang", required=True, help="target language: " + ", ".join(sorted(LANGUAGES)))
    args = p.parse_args(argv)
    result = corpus_score(read_lines(args.hyp), read_lines(args.ref), args.lang)
    print(f"METEOR = {result['score']:.2f} ({result['sentences']} sentences, {args.lang})")
    print(result["implementation"])


if __name__ == "__main__":
    main()
