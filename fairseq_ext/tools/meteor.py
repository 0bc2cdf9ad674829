"""METEOR without downloads, for the multi-source paper's tables (ms-1, ms-2): METEOR's formula computed here, with
METEOR 1.5's parameters (Denkowski & Lavie, 2014), exact and stem stages (nltk's Snowball stemmer), on a beam-search
alignment of its own (:func:`align`), statistics summed over the corpus. The stages, parameters, formula and the
comparison with METEOR 1.5's jar: docs/reproduction.md, "METEOR". A language without METEOR 1.5 parameters raises
:class:`MeteorUnavailable`.

    python -m fairseq_ext.tools.meteor --hyp hyp.detok --ref ref.detok --lang de
"""
import argparse
import importlib.metadata
from dataclasses import astuple, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_ext.common.data_text import read_lines
from fairseq_ext.errors import FairseqExtError
from fairseq_ext.standalone.moses import moses_tokenizer
from fairseq_ext.tools.translate import InputError

NLTK_PIN = "nltk==3.10.4"  # the Makefile's pin, named in the error when nltk is missing


class MeteorUnavailable(FairseqExtError):
    """METEOR cannot be computed here for this language; the message says why."""


@dataclass(frozen=True)
class Language:
    """One target language: METEOR 1.5's "rank" parameters, the Snowball stemmer of its stem stage
    (None: none) with its weight, and the METEOR 1.5 stages left out (they need data)."""

    name: str
    stemmer: Optional[str]
    alpha: float
    beta: float
    gamma: float
    stem_weight: float
    left_out: str


LANGUAGES: Dict[str, Language] = {
    "cs": Language("Czech", None, 0.95, 0.2, 0.6, 0.0, "paraphrase"),
    "de": Language("German", "german", 0.95, 1.0, 0.55, 0.8, "paraphrase"),
    "en": Language("English", "english", 0.85, 0.2, 0.6, 0.6, "synonym, paraphrase"),
    "es": Language("Spanish", "spanish", 0.65, 1.3, 0.5, 0.8, "paraphrase"),
    "fr": Language("French", "french", 0.9, 1.4, 0.6, 0.2, "paraphrase"),
}


@dataclass(frozen=True)
class Statistics:
    """METEOR's sufficient statistics of one sentence pair, or summed over a corpus."""

    hypothesis_words: int = 0
    reference_words: int = 0
    exact: int = 0
    stem: int = 0
    chunks: int = 0

    def __add__(self, other: "Statistics") -> "Statistics":
        return Statistics(*(a + b for a, b in zip(astuple(self), astuple(other))))


def score_of(stats: Statistics, setup: "Language") -> float:
    """METEOR (0-1) of sentence or corpus statistics: MeteorScorer.computeMetrics of METEOR
    1.5, without function words. With m_w the weighted matches, P = m_w / hypothesis words,
    R = m_w / reference words, Fmean = P * R / (alpha * P + (1 - alpha) * R), frag = chunks /
    matches (0 for the reference itself, in one chunk), score = Fmean * (1 - gamma * frag ** beta)."""
    matches = stats.exact + stats.stem
    weighted = stats.exact + setup.stem_weight * stats.stem
    if weighted == 0 or stats.hypothesis_words == 0 or stats.reference_words == 0:
        return 0.0
    precision, recall = weighted / stats.hypothesis_words, weighted / stats.reference_words
    fmean = precision * recall / (setup.alpha * precision + (1 - setup.alpha) * recall)
    perfect = matches == stats.hypothesis_words == stats.reference_words and stats.chunks == 1
    fragmentation = 0.0 if perfect else stats.chunks / matches
    return max(fmean * (1 - setup.gamma * fragmentation ** setup.beta), 0.0)


def _language(language: str) -> Language:
    if language not in LANGUAGES:
        raise MeteorUnavailable(f"METEOR for language {language!r} is unavailable: METEOR 1.5 has tuned parameters "
                                f"only for {', '.join(sorted(LANGUAGES))}, and only those are scored here")
    return LANGUAGES[language]


def _nltk_version() -> str:
    try:
        return importlib.metadata.version("nltk")
    except importlib.metadata.PackageNotFoundError:
        raise MeteorUnavailable(f"METEOR is unavailable: nltk is not installed ({NLTK_PIN})") from None


def describe(language: str) -> str:
    """One line naming the implementation, stages and parameters used for ``language``, for
    table captions; for a language that cannot be scored, a line saying so and why."""
    try:
        setup, version = _language(language), _nltk_version()
    except MeteorUnavailable as err:
        return str(err)
    weight = f", stem weight {setup.stem_weight}" if setup.stemmer else ""
    stages = f"exact+stem (nltk {version}'s Snowball {setup.stemmer} stemmer)" if setup.stemmer else "exact"
    return (f"METEOR: METEOR 1.5's formula and rank parameters alpha={setup.alpha} beta={setup.beta} "
            f"gamma={setup.gamma}{weight}, no function words; fairseq_ext's beam-search alignment (beam {BEAM}, "
            f"METEOR's order: matches, exact matches, chunks, distance), {stages}, no "
            f"{setup.left_out}; Moses-tokenized, lowercased; statistics summed over the corpus")


BEAM = 40  # METEOR 1.5's default beam (-x)


def align(hypothesis: Sequence[str], reference: Sequence[str], stem=None) -> List[Tuple[int, int, bool]]:
    """METEOR's alignment of two lowercased token lists, (hypothesis position, reference position,
    whether a stem match): the most matches (each word once), of those the most exact ones, then
    the fewest chunks, then the smallest sum of distances, by METEOR's beam search."""
    stems = ([stem(w) for w in hypothesis], [stem(w) for w in reference]) if stem else None
    candidates = []
    for i, word in enumerate(hypothesis):
        exact = [(j, False) for j, other in enumerate(reference) if other == word]
        by_stem = [(j, True) for j, other in enumerate(reference)
                   if stems and other != word and stems[1][j] == stems[0][i]]
        candidates.append(exact + by_stem)
    # a state: (matches, -stem matches, -chunks, -distance, used reference positions (bits), pairs)
    beam = [(0, 0, 0, 0, 0, ())]
    for i, options in enumerate(candidates):
        grown = []
        for matches, stemmed, chunks, distance, used, pairs in beam:
            grown.append((matches, stemmed, chunks, distance, used, pairs))
            for j, is_stem in options:
                if used >> j & 1:
                    continue
                last = pairs[-1] if pairs else None
                joined = last is not None and last[0] == i - 1 and last[1] == j - 1
                grown.append((matches + 1, stemmed - is_stem, chunks - (0 if joined else 1), distance - abs(i - j),
                              used | 1 << j, pairs + ((i, j, is_stem),)))
        grown.sort(key=lambda state: state[:4], reverse=True)
        beam = grown[:BEAM]
    return list(beam[0][5])


class _Scorer:
    """The sentence statistics of one language: Moses-tokenized, lowercased, aligned."""

    def __init__(self, language: str):
        from nltk.stem.snowball import SnowballStemmer

        self.setup = _language(language)
        _nltk_version()
        self.stem = SnowballStemmer(self.setup.stemmer).stem if self.setup.stemmer else None
        self.tokenize = moses_tokenizer(language, escape=False)

    def statistics(self, hypothesis: str, reference: str) -> Statistics:
        hyp, ref = self.tokenize(hypothesis).lower().split(), self.tokenize(reference).lower().split()
        pairs = align(hyp, ref, self.stem)
        chunks = sum(1 for k, (i, j, _) in enumerate(pairs)
                     if k == 0 or (pairs[k - 1][0], pairs[k - 1][1]) != (i - 1, j - 1))
        stem = sum(1 for pair in pairs if pair[2])
        return Statistics(len(hyp), len(ref), len(pairs) - stem, stem, chunks)


def sentence_score(hypothesis: str, reference: str, language: str) -> float:
    """METEOR (0-100) of one detokenized sentence against its reference."""
    scorer = _Scorer(language)
    return 100 * score_of(scorer.statistics(hypothesis, reference), scorer.setup)


def corpus_statistics(hypotheses: Sequence[str], references: Sequence[str], language: str) -> Statistics:
    """The summed statistics of parallel lists (errors as :func:`corpus_score`)."""
    if len(hypotheses) != len(references):
        raise InputError(f"METEOR: {len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise InputError("METEOR: no sentences to score")
    scorer = _Scorer(language)
    return sum((scorer.statistics(hyp, ref) for hyp, ref in zip(hypotheses, references)), Statistics())


def corpus_score(hypotheses: List[str], references: List[str], language: str) -> dict:
    """METEOR (0-100) of detokenized ``hypotheses`` against one reference each. Raises
    MeteorUnavailable for a language that cannot be scored, InputError for lists not parallel."""
    total = corpus_statistics(hypotheses, references, language)
    return {"score": 100 * score_of(total, _language(language)), "implementation": describe(language),
            "language": language, "sentences": len(hypotheses)}


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
