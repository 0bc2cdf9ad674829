"""METEOR without downloads (fairseq_ext/tools/meteor.py): METEOR's formula worked out by hand
on sentences whose alignment is plain to see, with METEOR 1.5's "rank" parameters of the
language written out here; the corpus score sums the sentences' statistics, as METEOR does;
a hypothesis equal to its reference scores 100; the alignment finds the fewest chunks, as
METEOR's does; a German (and a French) stem match counts at its weight, and Czech matches
exactly only; the score tracks METEOR 1.5's jar on stored German outputs; a language without a
setup says so instead of scoring; and no data is read from nltk's data path nor from the
network while scoring."""
import os
import socket

import nltk
import pytest
from nltk.stem.snowball import SnowballStemmer
from sacremoses import MosesTokenizer

from fairseq_ext.common.data_text import read_lines
from fairseq_ext.errors import FairseqExtError
from fairseq_ext.tools import meteor
from fairseq_ext.tools.translate import InputError
from model_utils import REPO
from script_utils import MULTI30K, head_gz, needs_multi30k, write_lines

# METEOR 1.5's task "rank" (alpha, beta, gamma, stem module weight), as its jar prints them
# with -l LANG -m 'exact stem'
RANK = {"cs": (0.95, 0.2, 0.6, 0.0), "de": (0.95, 1.0, 0.55, 0.8), "en": (0.85, 0.2, 0.6, 0.6),
        "es": (0.65, 1.3, 0.5, 0.8), "fr": (0.9, 1.4, 0.6, 0.2)}


class _NoSynsets:
    """A WordNet with no synsets: nltk's synonym stage matches nothing and reads no data."""

    def synsets(self, word, *args, **kwargs):
        return []


def by_hand(exact, stem, hyp_len, ref_len, chunks, language):
    """METEOR (0-1) from counts: weighted matches for P and R, all matches for the
    fragmentation, none for a hypothesis that is its reference in one chunk."""
    alpha, beta, gamma, weight = RANK[language]
    matches, weighted = exact + stem, exact + weight * stem
    if weighted == 0:
        return 0.0
    p, r = weighted / hyp_len, weighted / ref_len
    fmean = p * r / (alpha * p + (1 - alpha) * r)
    frag = 0 if matches == hyp_len == ref_len and chunks == 1 else chunks / matches
    return fmean * (1 - gamma * frag ** beta)


# (hypothesis, reference, exact, stem, hypothesis tokens, reference tokens, chunks) in German
GERMAN = [
    # ein|hund|über die|wiese . : 6 exact matches in 4 chunks; läuft/rennt do not match
    ("Ein Hund läuft über die Wiese.", "Ein brauner Hund rennt über die grüne Wiese.", 6, 0, 7, 9, 4),
    # zwei hunde~hund spielen im | schnee . : 5 exact + 1 stem match in 2 chunks
    ("Zwei Hunde spielen im Schnee.", "Zwei Hund spielen im tiefen Schnee.", 5, 1, 6, 7, 2),
    ("Eine Katze schläft", "Zwei Männer arbeiten", 0, 0, 3, 3, 0),
]


def test_the_corpus_score_sums_the_sentences_statistics_as_meteor_does():
    hyps, refs = [g[0] for g in GERMAN], [g[1] for g in GERMAN]
    assert [meteor.sentence_score(h, r, "de") for h, r in zip(hyps, refs)] == \
        pytest.approx([100 * by_hand(*g[2:], "de") for g in GERMAN])
    summed = [sum(g[k] for g in GERMAN) for k in range(2, 7)]
    result = meteor.corpus_score(hyps, refs, "de")
    assert result["score"] == pytest.approx(100 * by_hand(*summed, "de"), abs=1e-9)
    mean = 100 * sum(by_hand(*g[2:], "de") for g in GERMAN) / len(GERMAN)
    assert abs(result["score"] - mean) > 1  # not nltk's mean of sentence scores
    assert result["sentences"] == 3 and result["language"] == "de"
    assert result["implementation"] == meteor.describe("de")
    assert "nltk" not in result["implementation"].split("alignment")[0]  # the alignment is ours, not nltk's
    assert "beam-search alignment (beam 40" in result["implementation"]
    assert f"exact+stem (nltk {nltk.__version__}'s Snowball german stemmer)" in result["implementation"]
    assert "alpha=0.95 beta=1.0 gamma=0.55, stem weight 0.8" in result["implementation"]
    assert "statistics summed over the corpus" in result["implementation"]


@pytest.mark.parametrize("language", sorted(RANK))
def test_a_hypothesis_equal_to_its_reference_scores_100(language):
    sentence = "Ein Mann fährt mit dem Fahrrad."
    assert meteor.sentence_score(sentence, sentence, language) == pytest.approx(100)
    assert meteor.corpus_score([sentence.upper()], [sentence], language)["score"] == pytest.approx(100)
    worse = ["Ein Mann fährt mit dem Auto.", "Mann Ein fährt mit dem Fahrrad.", "Ein Mann fährt mit dem."]
    for hyp in worse:
        assert meteor.corpus_score([hyp], [sentence], language)["score"] < 99


def test_the_alignment_has_the_fewest_chunks():
    """Each "the" could match either "the" of the reference: nltk's aligner takes the first
    and cuts the sentence into 5 chunks, METEOR's (and ours) finds the 2."""
    from nltk.translate.meteor_score import _count_chunks, align_words

    hyp, ref = "the cat sat on the mat".split(), "on the mat the cat sat".split()
    assert _count_chunks(align_words(hyp, ref, wordnet=_NoSynsets())[0]) == 5
    pairs = meteor.align(hyp, ref)
    assert sorted(pairs) == [(0, 3, False), (1, 4, False), (2, 5, False), (3, 0, False), (4, 1, False),
                             (5, 2, False)]
    assert meteor.corpus_statistics([" ".join(hyp)], [" ".join(ref)], "en").chunks == 2


def test_german_and_french_stems_match_at_their_weight_czech_is_exact_only():
    german, french = SnowballStemmer("german"), SnowballStemmer("french")
    assert german.stem("hunde") == german.stem("hund") and french.stem("chiens") == french.stem("chien")
    # every word matched in one chunk (no penalty), by its stem: P = R = the stem weight
    assert meteor.corpus_score(["Hunde"], ["Hund"], "de")["score"] == pytest.approx(100 * 0.8)
    assert meteor.corpus_score(["chiens"], ["chien"], "fr")["score"] == pytest.approx(100 * 0.2)
    assert meteor.corpus_score(["Hunde bellen"], ["Hund"], "de")["score"] == pytest.approx(100 * by_hand(0, 1, 2, 1, 1,
                                                                                                          "de"))
    assert meteor.corpus_score(["Hunde"], ["Hund"], "cs")["score"] == 0.0
    assert meteor.describe("cs").startswith("METEOR: METEOR 1.5's formula and rank parameters alpha=0.95 beta=0.2 "
                                            "gamma=0.6, no function words; fairseq_ext's beam-search alignment")
    assert "exact, no paraphrase" in meteor.describe("cs") and "nltk" not in meteor.describe("cs")


JAR = os.path.join(REPO, "docs", "benchmarks", "meteor-1.5-jar")
RUNS = os.path.join(REPO, "docs", "benchmarks", "cpu-multi30k")


@pytest.mark.parametrize("row", ["baseline", "mma"])
def test_the_score_tracks_meteor_1_5s_jar_on_stored_outputs(row):
    """The jar's own system scores (docs/benchmarks/meteor-1.5-jar, its exact and stem stages
    with its function words) against ours on the same German outputs: a few tenths above,
    never the 1-point gaps of a mean of sentence scores."""
    with open(os.path.join(JAR, f"{row}.txt"), encoding="utf-8") as f:
        jar = 100 * float(next(line for line in f if line.startswith("Final score:")).split()[-1])
    hyp = read_lines(os.path.join(RUNS, row, "multi30k-en-de.800", "eval-test", "hyp.detok"))
    ref = read_lines(os.path.join(RUNS, "baseline", "multi30k-en-de.800", "eval-test", "ref.detok"))
    ours = meteor.corpus_score(hyp, ref, "de")["score"]
    assert 0 < ours - jar < 0.5, (ours, jar)


def test_unsupported_language_is_unavailable_not_a_number():
    with pytest.raises(meteor.MeteorUnavailable, match="'zh'") as err:
        meteor.corpus_score(["你好"], ["你好"], "zh")
    assert isinstance(err.value, FairseqExtError)
    line = meteor.describe("zh")
    assert "unavailable" in line and "'zh'" in line


def test_hypotheses_and_references_must_be_parallel():
    with pytest.raises(InputError, match="2 hypotheses but 1 references"):
        meteor.corpus_score(["a", "b"], ["a"], "en")
    with pytest.raises(InputError, match="no sentences"):
        meteor.corpus_score([], [], "en")


def test_nothing_is_downloaded_or_read_from_nltk_data(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError(f"METEOR tried to fetch or read data: {args}")

    monkeypatch.setenv("NLTK_DATA", str(tmp_path))
    monkeypatch.setattr(nltk.data, "find", refuse)
    monkeypatch.setattr(nltk.data, "load", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    # the guard bites: nltk's own default (WordNet synonyms) would look for its data
    from nltk.translate.meteor_score import single_meteor_score
    with pytest.raises(AssertionError, match="fetch or read data"):
        single_meteor_score(["ein", "hund"], ["zwei", "katzen"])
    for language in sorted(RANK):
        assert meteor.corpus_score([GERMAN[1][0]], [GERMAN[1][1]], language)["score"] > 0


def test_cli_prints_the_score_and_the_implementation(tmp_path, capsys):
    hyp, ref = tmp_path / "hyp.de", tmp_path / "ref.de"
    write_lines(hyp, [g[0] for g in GERMAN])
    write_lines(ref, [g[1] for g in GERMAN])
    meteor.main(["--hyp", str(hyp), "--ref", str(ref), "--lang", "de"])
    expected = 100 * by_hand(*[sum(g[k] for g in GERMAN) for k in range(2, 7)], "de")
    assert capsys.readouterr().out.splitlines() == [f"METEOR = {expected:.2f} (3 sentences, de)",
                                                    meteor.describe("de")]


@needs_multi30k
def test_multi30k_czech_reference_against_itself():
    lines = head_gz(MULTI30K / "test_2016_flickr.cs.gz", 203)
    tokenizer = MosesTokenizer(lang="cs")
    lengths = [len(tokenizer.tokenize(line, escape=False)) for line in lines]
    result = meteor.corpus_score(lines, lines, "cs")
    assert result["sentences"] == 203
    # every word matched, one chunk a sentence: summed, the penalty of 203 chunks remains
    assert result["score"] == pytest.approx(100 * by_hand(sum(lengths), 0, sum(lengths), sum(lengths), 203, "cs"))
    assert all(meteor.sentence_score(line, line, "cs") == pytest.approx(100) for line in lines[:20])
