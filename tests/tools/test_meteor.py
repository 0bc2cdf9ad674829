"""METEOR without downloads (fairseq_ext/tools/meteor.py): the corpus score equals the METEOR
formula worked out by hand on sentences whose alignment is plain to see, with METEOR 1.5's
"rank" parameters of the language written out here; identical strings get the most a
sentence of their length can get; a German (and a French) stem match counts, and Czech
matches exactly only; a language without a setup says so instead of scoring; and no data is
read from nltk's data path nor from the network while scoring."""
import socket

import nltk
import pytest
from nltk.stem.snowball import SnowballStemmer
from sacremoses import MosesTokenizer

from fairseq_ext.errors import FairseqExtError
from fairseq_ext.tools import meteor
from fairseq_ext.tools.translate import InputError
from script_utils import MULTI30K, head_gz, needs_multi30k, write_lines

# METEOR 1.5's task "rank" (alpha, beta, gamma), as its jar prints them with -l LANG
RANK = {"cs": (0.95, 0.2, 0.6), "de": (0.95, 1.0, 0.55), "en": (0.85, 0.2, 0.6),
        "es": (0.65, 1.3, 0.5), "fr": (0.9, 1.4, 0.6)}


def by_hand(matches, hyp_len, ref_len, chunks, language):
    """METEOR of one sentence from its counts (0-1)."""
    if matches == 0:
        return 0.0
    alpha, beta, gamma = RANK[language]
    p, r = matches / hyp_len, matches / ref_len
    fmean = p * r / (alpha * p + (1 - alpha) * r)
    return fmean * (1 - gamma * (chunks / matches) ** beta)


# (hypothesis, reference, matches, hypothesis tokens, reference tokens, chunks) in German
GERMAN = [
    # ein|hund|über die|wiese . : 6 exact matches in 4 chunks; läuft/rennt do not match
    ("Ein Hund läuft über die Wiese.", "Ein brauner Hund rennt über die grüne Wiese.", 6, 7, 9, 4),
    # zwei hunde~hund spielen im | schnee . : 5 exact + 1 stem match in 2 chunks
    ("Zwei Hunde spielen im Schnee.", "Zwei Hund spielen im tiefen Schnee.", 6, 6, 7, 2),
    ("Eine Katze schläft", "Zwei Männer arbeiten", 0, 3, 3, 0),
]


def test_corpus_score_is_the_mean_of_hand_computed_sentence_scores():
    hyps, refs = [g[0] for g in GERMAN], [g[1] for g in GERMAN]
    expected = 100 * sum(by_hand(*g[2:], "de") for g in GERMAN) / len(GERMAN)
    result = meteor.corpus_score(hyps, refs, "de")
    assert result["score"] == pytest.approx(expected, abs=1e-9)
    assert 0 < result["score"] < 100
    assert result["sentences"] == 3 and result["language"] == "de"
    assert result["implementation"] == meteor.describe("de")
    assert f"nltk {nltk.__version__}" in result["implementation"]
    assert "exact+stem (Snowball german)" in result["implementation"]
    assert "alpha=0.95 beta=1.0 gamma=0.55" in result["implementation"]


@pytest.mark.parametrize("language", sorted(RANK))
def test_identical_strings_get_the_maximum(language):
    sentence = "Ein Mann fährt mit dem Fahrrad."  # 7 tokens: one chunk of 7 matches
    best = 100 * by_hand(7, 7, 7, 1, language)
    assert meteor.corpus_score([sentence], [sentence], language)["score"] == pytest.approx(best)
    assert meteor.corpus_score([sentence.upper()], [sentence], language)["score"] == pytest.approx(best)
    worse = ["Ein Mann fährt mit dem Auto.", "Mann Ein fährt mit dem Fahrrad.", "Ein Mann fährt mit dem."]
    for hyp in worse:
        assert meteor.corpus_score([hyp], [sentence], language)["score"] < best - 1


def test_german_and_french_stems_match_czech_is_exact_only():
    german, french = SnowballStemmer("german"), SnowballStemmer("french")
    assert german.stem("hunde") == german.stem("hund") and french.stem("chiens") == french.stem("chien")
    # one match in one chunk: score = 1 - gamma
    assert meteor.corpus_score(["Hunde"], ["Hund"], "de")["score"] == pytest.approx(100 * (1 - 0.55))
    assert meteor.corpus_score(["chiens"], ["chien"], "fr")["score"] == pytest.approx(100 * (1 - 0.6))
    assert meteor.corpus_score(["Hunde"], ["Hund"], "cs")["score"] == 0.0
    assert meteor.describe("cs").startswith(f"METEOR: nltk {nltk.__version__} meteor_score, exact, no paraphrase")


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
    expected = 100 * sum(by_hand(*g[2:], "de") for g in GERMAN) / len(GERMAN)
    assert capsys.readouterr().out.splitlines() == [f"METEOR = {expected:.2f} (3 sentences, de)",
                                                    meteor.describe("de")]


@needs_multi30k
def test_multi30k_czech_reference_against_itself():
    lines = head_gz(MULTI30K / "test_2016_flickr.cs.gz", 203)
    tokenizer = MosesTokenizer(lang="cs")
    lengths = [len(tokenizer.tokenize(line, escape=False)) for line in lines]
    expected = 100 * sum(by_hand(n, n, n, 1, "cs") for n in lengths) / len(lengths)
    result = meteor.corpus_score(lines, lines, "cs")
    assert result["sentences"] == 203
    assert result["score"] == pytest.approx(expected)
