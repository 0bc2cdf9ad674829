"""The data recipes (scripts/prepare-*.sh) and scripts/significance.sh.

Multi30k and IWSLT'15 En-Vi run on small slices of the local copies in $FAIRSEQ_EXT_DATA
(skipped when absent); IWSLT'14, IWSLT Fr/Ro and WMT'14, whose releases are not stored
locally, run on tiny synthetic corpora laid out like the official releases. Bad input
(missing file, mismatched line counts, empty corpus, failed download) must fail with a
clear message and leave no output directory behind. Everything is written under tmp_path;
line counts are not multiples of 8 (fairseq batches in multiples of 8: a dropped or padded
last batch shows).
"""
import gzip
import json
import random
import sys
import tarfile
from pathlib import Path

import pytest

from script_utils import ENVI, MULTI30K, SCRIPTS, head_gz, needs_envi, needs_multi30k, run, write_lines


# ----------------------------------------------------------------------------- helpers
def assert_databin(out, src, tgt, splits=("train", "valid", "test")):
    out = Path(out)
    assert (out / f"dict.{src}.txt").is_file() and (out / f"dict.{tgt}.txt").is_file()
    # --joined-dictionary: one dictionary for both sides
    assert (out / f"dict.{src}.txt").read_text() == (out / f"dict.{tgt}.txt").read_text()
    for split in splits:
        for lang in (src, tgt):
            for ext in ("bin", "idx"):
                f = out / f"{split}.{src}-{tgt}.{lang}.{ext}"
                assert f.is_file() and f.stat().st_size > 0, f
    for split in ("valid", "test"):
        for kind in ("raw", "tok"):
            assert (out / "text" / f"{split}.{kind}.{tgt}").is_file()
    env = dict(line.split("=", 1) for line in (out / "prep.env").read_text().splitlines()
               if line and not line.startswith("#"))
    assert env["src"] == src and env["tgt"] == tgt
    # the reference text is line-aligned with the binarized test set
    n_test = int(env["test_pairs"])
    assert len((out / "text" / f"test.raw.{tgt}").read_text().splitlines()) == n_test
    return env


def assert_failed_cleanly(res, out, *needles):
    assert res.returncode != 0, res.stderr
    for needle in needles:
        assert needle in res.stderr, f"{needle!r} not in stderr:\n{res.stderr}"
    out = Path(out)
    assert not out.exists(), f"{out} left behind"
    leftovers = [p.name for p in out.parent.glob(f".{out.name}.tmp.*")]
    assert not leftovers, f"temporary directories left behind: {leftovers}"


# synthetic parallel text: a deterministic "language" per code, word-by-word translation
_WORDS = ["dog", "cat", "man", "woman", "child", "ball", "street", "house", "red", "blue",
          "runs", "sits", "plays", "looks", "big", "small", "green", "water", "tree", "car",
          "walks", "jumps", "eats", "reads", "book", "table", "white", "black", "old", "young"]


def _lex(lang):
    if lang == "en":
        return {w: w for w in _WORDS}
    rng = random.Random(lang)
    return {w: "".join(rng.choice("aeioubdgklmnprstvz") for _ in range(rng.randint(3, 8)))
            for w in _WORDS}


def synthetic_pairs(l1, l2, n, seed):
    rng = random.Random(seed)
    lex1, lex2 = _lex(l1), _lex(l2)
    rows1, rows2 = [], []
    for _ in range(n):
        sent = [rng.choice(_WORDS) for _ in range(rng.randint(3, 12))]
        cap = lambda ws: (ws[0].capitalize() + " " + " ".join(ws[1:]) + ".") if ws else ""
        rows1.append(cap([lex1[w] for w in sent]))
        rows2.append(cap([lex2[w] for w in sent]))
    return rows1, rows2


def fake_iwslt_release(root, rel, year, sets, n_train=241, n_eval=30, gz=False):
    """Files as in a WIT3 texts archive: REL/train.tags.REL.L and IWSLTyy.TED.SET.REL.L.xml."""
    l1, l2 = rel.split("-")
    d = Path(root) / rel
    t1, t2 = synthetic_pairs(l1, l2, n_train, seed=1)
    head = ["<url>http://www.ted.com/talks/x.html</url>", "<keywords>talks</keywords>",
            "<speaker>Someone</speaker>", "<talkid>1</talkid>"]
    write_lines(d / f"train.tags.{rel}.{l1}", head + t1, gz)
    write_lines(d / f"train.tags.{rel}.{l2}", head + t2, gz)
    for k, s in enumerate(sets):
        e1, e2 = synthetic_pairs(l1, l2, n_eval, seed=100 + k)
        for lang, rows in ((l1, e1), (l2, e2)):
            xml = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>",
                   f'<srcset setid="IWSLT{year}.TED.{s}" srclang="{lang}">',
                   '<doc docid="1" genre="lectures">', "<talkid>1</talkid>"]
            xml += [f'<seg id="{i + 1}"> {r} </seg>' for i, r in enumerate(rows)]
            xml += ["</doc>", "</srcset>", "</mteval>"]
            write_lines(d / f"IWSLT{year}.TED.{s}.{rel}.{lang}.xml", xml, gz)
    return d


def fake_wmt_release(root, n=150):
    """Unpacked WMT'14 archives: training/, commoncrawl, dev/newstest2013, test-full/*.sgm."""
    root = Path(root)
    for k, c in enumerate(["training/europarl-v7.de-en", "commoncrawl.de-en",
                           "training/news-commentary-v9.de-en"]):
        en, de = synthetic_pairs("en", "de", n, seed=10 + k)
        write_lines(root / f"{c}.en", en)
        write_lines(root / f"{c}.de", de)
    en, de = synthetic_pairs("en", "de", 41, seed=20)
    write_lines(root / "dev/newstest2013.en", en)
    write_lines(root / "dev/newstest2013.de", de)
    en, de = synthetic_pairs("en", "de", 50, seed=21)
    for lang, rows, kind in (("en", en, "src"), ("de", de, "ref")):
        sgm = [f'<{kind}set setid="newstest2014" srclang="any" trglang="{lang}">',
               '<doc sysid="ref" docid="1" genre="news" origlang="en">']
        sgm += [f'<seg id="{i + 1}">{r}</seg>' for i, r in enumerate(rows)]
        sgm += ["</doc>", f"</{kind}set>"]
        write_lines(root / f"test-full/newstest2014-deen-{kind}.{lang}.sgm", sgm)
    return root


@pytest.fixture
def m30k_slice(tmp_path):
    """First 300/60/60 lines of the local Multi30k copy, all four languages, gzipped."""
    d = tmp_path / "m30k"
    for split, n in (("train", 300), ("val", 60), ("test_2016_flickr", 60)):
        for lang in ("en", "de", "fr", "cs"):
            write_lines(d / f"{split}.{lang}", head_gz(MULTI30K / f"{split}.{lang}.gz", n), gz=True)
    return d


# ----------------------------------------------------------------------------- Multi30k
@needs_multi30k
def test_multi30k_en_de(m30k_slice, tmp_path):
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-multi30k.sh", "--from", m30k_slice, "--out", out,
               "--bpe-merges", "500", "--workers", "1"])
    assert res.returncode == 0, res.stderr
    env = assert_databin(out, "en", "de")
    assert (out / "code").is_file()
    assert env["train_pairs"] == "300" and env["test_pairs"] == "60"
    assert env["test_set"] == "test_2016_flickr"
    # Moses tokenization of the raw captions, original text kept as the detok reference
    raw = (out / "text" / "test.raw.de").read_text().splitlines()
    tok = (out / "text" / "test.tok.de").read_text().splitlines()
    assert raw[0].endswith(".") and not raw[0].endswith(" .")
    assert tok[0].endswith(" .")


@needs_multi30k
@pytest.mark.slow
def test_multi30k_fr_sentencepiece_plain_files_max_lines(m30k_slice, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for gz in m30k_slice.glob("*.gz"):  # plain (not gzipped) input is accepted too
        (plain / gz.name[:-3]).write_text(gzip.open(gz, "rt", encoding="utf-8").read())
    out = tmp_path / "bin-fr"
    res = run([SCRIPTS / "prepare-multi30k.sh", "--from", plain, "--src", "en", "--tgt", "fr",
               "--out", out, "--bpe", "sentencepiece", "--bpe-merges", "400",
               "--max-lines", "201", "--workers", "1"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    env = assert_databin(out, "en", "fr")
    assert (out / "spm.model").is_file() and env["bpe"] == "sentencepiece"
    assert env["train_pairs"] == "201"


@needs_multi30k
def test_multi30k_missing_file(m30k_slice, tmp_path):
    (m30k_slice / "val.de.gz").unlink()
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-multi30k.sh", "--from", m30k_slice, "--out", out])
    assert_failed_cleanly(res, out, "missing file", "val.de")


@needs_multi30k
def test_multi30k_mismatched_line_counts(m30k_slice, tmp_path):
    write_lines(m30k_slice / "train.de", head_gz(m30k_slice / "train.de.gz", 299), gz=True)
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-multi30k.sh", "--from", m30k_slice, "--out", out])
    assert_failed_cleanly(res, out, "mismatched line counts", "300", "299")


@needs_multi30k
def test_multi30k_empty_corpus(m30k_slice, tmp_path):
    write_lines(m30k_slice / "train.en", [], gz=True)
    write_lines(m30k_slice / "train.de", [], gz=True)
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-multi30k.sh", "--from", m30k_slice, "--out", out])
    assert_failed_cleanly(res, out, "empty corpus")


@needs_multi30k
def test_existing_output_needs_force(m30k_slice, tmp_path):
    out = tmp_path / "bin"
    out.mkdir()
    (out / "keep").write_text("x")
    res = run([SCRIPTS / "prepare-multi30k.sh", "--from", m30k_slice, "--out", out])
    assert res.returncode != 0 and "--force" in res.stderr
    assert (out / "keep").read_text() == "x"


def test_failed_download_suggests_from(tmp_path):
    out = tmp_path / "bin"
    # a closed local port: the download fails at once, as it does offline
    res = run([SCRIPTS / "prepare-multi30k.sh", "--out", out],
              env_extra={"MULTI30K_URL": "http://127.0.0.1:9/multi30k", "FAIRSEQ_EXT_DATA": str(tmp_path)})
    assert_failed_cleanly(res, out, "download failed", "--from")


def test_prepare_reads_the_local_copy_in_fairseq_ext_data(m30k_small, tmp_path):
    """Offline, with $FAIRSEQ_EXT_DATA holding multi30k/ (as quickstart and reproduce read it):
    `fairseq-ext prepare multi30k --out DIR` reads that copy and downloads nothing."""
    data = tmp_path / "corpora"
    data.mkdir()
    (data / "multi30k").symlink_to(m30k_small, target_is_directory=True)
    out = tmp_path / "bin"
    res = run([sys.executable, "-m", "fairseq_ext", "prepare", "multi30k", "--out", out, "--bpe-merges", "50"],
              env_extra={"MULTI30K_URL": "http://127.0.0.1:9/multi30k", "FAIRSEQ_EXT_DATA": str(data)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"reading the local copy {data}/multi30k ($FAIRSEQ_EXT_DATA/multi30k" in res.stderr
    assert (out / "train.en-de.en.bin").exists() and "download" not in res.stderr.lower()


def test_bad_options(tmp_path):
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-multi30k.sh", "--out", out, "--src", "xx"])
    assert_failed_cleanly(res, out, "not in Multi30k")
    res = run([SCRIPTS / "prepare-iwslt14.sh", "--out", out, "--pair", "fr-en"])
    assert_failed_cleanly(res, out, "--pair must be")
    res = run([SCRIPTS / "prepare-multi30k.sh", "--out", out, "--from", tmp_path / "nope"])
    assert_failed_cleanly(res, out, "no such file or directory")
    res = run([SCRIPTS / "prepare-wmt14-en-de.sh", "--bogus"])
    assert res.returncode != 0 and "unknown option: --bogus" in res.stderr
    res = run([SCRIPTS / "prepare-multi30k.sh", "--out", out, "--bpe-merges", "0"])
    assert_failed_cleanly(res, out, "--bpe-merges must be at least 1")


# ----------------------------------------------------------------------------- IWSLT'15 En-Vi
@pytest.fixture
def envi_slice(tmp_path):
    d = tmp_path / "envi"
    for lang in ("en", "vi"):
        write_lines(d / f"train.{lang}", head_gz(ENVI / f"train.{lang}.gz", 401), gz=True)
        write_lines(d / f"tst2012.{lang}", head_gz(ENVI / f"tst2012.{lang}.gz", 50))
    return d


@needs_envi
@pytest.mark.slow
def test_envi_fallback_without_tst2013(envi_slice, tmp_path):
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt15-en-vi.sh", "--from", envi_slice, "--out", out,
               "--bpe-merges", "500", "--workers", "1"])
    assert res.returncode == 0, res.stderr
    assert "tst2013" in res.stderr and "FALLBACK SPLIT" in res.stderr
    env = assert_databin(out, "en", "vi")
    assert env["test_set"] == "tst2012" and env["test_pairs"] == "50"
    assert int(env["train_pairs"]) + int(env["valid_pairs"]) == 401
    # already tokenized with XML escapes: tok keeps them, raw is detokenized
    tok = (out / "text" / "test.tok.en").read_text()
    raw = (out / "text" / "test.raw.en").read_text()
    assert "&apos;" in tok and "&apos;" not in raw


@needs_envi
@pytest.mark.slow
def test_envi_with_tst2013_vi_en(envi_slice, tmp_path):
    for lang in ("en", "vi"):  # stand-in for tst2013
        write_lines(envi_slice / f"tst2013.{lang}", head_gz(ENVI / f"tst2012.{lang}.gz", 30, skip=50))
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt15-en-vi.sh", "--from", envi_slice, "--out", out,
               "--src", "vi", "--tgt", "en", "--bpe-merges", "500", "--max-lines", "300",
               "--workers", "1"])
    assert res.returncode == 0, res.stderr
    assert "FALLBACK" not in res.stderr
    env = assert_databin(out, "vi", "en")
    assert env["valid_set"] == "tst2012" and env["test_set"] == "tst2013"
    assert env["train_pairs"] == "300" and env["valid_pairs"] == "50" and env["test_pairs"] == "30"


@needs_envi
def test_envi_mismatched_dev(envi_slice, tmp_path):
    write_lines(envi_slice / "tst2012.vi", head_gz(ENVI / "tst2012.vi.gz", 49))
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt15-en-vi.sh", "--from", envi_slice, "--out", out])
    assert_failed_cleanly(res, out, "mismatched line counts")


# ----------------------------------------------------------------------------- IWSLT'14
@pytest.mark.slow
def test_iwslt14_de_en(tmp_path):
    fake_iwslt_release(tmp_path / "rel", "de-en", 14, ["dev2010", "tst2010", "tst2011", "tst2012"])
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt14.sh", "--from", tmp_path / "rel", "--out", out,
               "--bpe-merges", "200", "--workers", "1"])
    assert res.returncode == 0, res.stderr
    env = assert_databin(out, "de", "en")
    assert env["lowercase"] == "1"
    # valid = every 23rd training pair; test = dev2010 + tst2010-2012
    assert int(env["valid_pairs"]) == 241 // 23
    assert env["test_pairs"] == str(4 * 30)
    test_tok = (out / "text" / "test.tok.en").read_text()
    assert test_tok == test_tok.lower() and "<seg" not in test_tok
    assert "<url>" not in (out / "text" / "valid.tok.en").read_text()


@pytest.mark.slow
def test_iwslt14_es_en_archive_and_fallback(tmp_path):
    rel = fake_iwslt_release(tmp_path / "src", "es-en", 14,
                             ["dev2010", "tst2010", "tst2011", "tst2012", "tst2014"], gz=True)
    (tmp_path / "rel").mkdir()
    with tarfile.open(tmp_path / "rel" / "es-en.tgz", "w:gz") as tar:  # the archive as released
        tar.add(rel, arcname="es-en")
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt14.sh", "--pair", "en-es", "--from", tmp_path / "rel",
               "--out", out, "--bpe-merges", "200", "--workers", "1"])
    assert res.returncode == 0, res.stderr
    env = assert_databin(out, "en", "es")
    assert env["lowercase"] == "0" and env["test_set"] == "tst2014"
    assert env["valid_pairs"] == str(4 * 30) and env["test_pairs"] == "30"

    # without tst2014: warning and the documented fallback split
    for f in rel.glob("IWSLT14.TED.tst2014.*"):
        f.unlink()
    out2 = tmp_path / "bin2"
    res = run([SCRIPTS / "prepare-iwslt14.sh", "--pair", "es-en", "--from", rel.parent,
               "--out", out2, "--bpe-merges", "200", "--workers", "1"])
    assert res.returncode == 0, res.stderr
    assert "FALLBACK SPLIT" in res.stderr
    env = assert_databin(out2, "es", "en")
    assert env["test_set"] == "tst2012" and env["valid_pairs"] == str(3 * 30)


def test_iwslt14_missing_devset(tmp_path):
    rel = fake_iwslt_release(tmp_path / "rel", "de-en", 14, ["dev2010", "tst2010", "tst2011"])
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt14.sh", "--from", rel.parent, "--out", out])
    assert_failed_cleanly(res, out, "missing file", "tst2012")


def test_iwslt14_mismatched_train(tmp_path):
    rel = fake_iwslt_release(tmp_path / "rel", "de-en", 14, ["dev2010", "tst2010", "tst2011", "tst2012"])
    lines = (rel / "train.tags.de-en.de").read_text().splitlines()
    write_lines(rel / "train.tags.de-en.de", lines[:-5])
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt14.sh", "--from", rel.parent, "--out", out])
    assert_failed_cleanly(res, out, "mismatched line counts")


# ----------------------------------------------------------------------------- IWSLT Fr / Ro
@pytest.mark.slow
def test_iwslt_ro_en(tmp_path):
    fake_iwslt_release(tmp_path / "rel", "ro-en", 14,
                       ["dev2010", "tst2010", "tst2011", "tst2012", "tst2014"])
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt-fr-ro.sh", "--pair", "ro-en", "--from", tmp_path / "rel",
               "--out", out, "--bpe-merges", "200", "--workers", "1"])
    assert res.returncode == 0, res.stderr
    env = assert_databin(out, "ro", "en")
    assert env["test_set"] == "tst2014" and env["valid_set"] == "dev2010+tst2010+tst2011+tst2012"


@pytest.mark.slow
def test_iwslt_en_fr_fallback(tmp_path):
    # IWSLT'15 En-Fr without the separately released tst2014/tst2015
    fake_iwslt_release(tmp_path / "rel", "en-fr", 15,
                       ["dev2010", "tst2010", "tst2011", "tst2012", "tst2013"])
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt-fr-ro.sh", "--pair", "fr-en", "--from", tmp_path / "rel",
               "--out", out, "--bpe-merges", "200", "--workers", "1"])
    assert res.returncode == 0, res.stderr
    assert "FALLBACK SPLIT" in res.stderr
    env = assert_databin(out, "fr", "en")
    assert env["test_set"] == "tst2013" and env["test_pairs"] == "30"


def test_iwslt_fr_ro_needs_pair(tmp_path):
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt-fr-ro.sh", "--out", out])
    assert_failed_cleanly(res, out, "--pair is required")


def test_iwslt_ro_en_empty_train(tmp_path):
    rel = fake_iwslt_release(tmp_path / "rel", "ro-en", 14,
                             ["dev2010", "tst2010", "tst2011", "tst2012", "tst2014"])
    for lang in ("ro", "en"):
        write_lines(rel / f"train.tags.ro-en.{lang}", [])
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-iwslt-fr-ro.sh", "--pair", "ro-en", "--from", rel.parent,
               "--out", out])
    assert_failed_cleanly(res, out, "empty corpus")


# ----------------------------------------------------------------------------- WMT'14
@pytest.mark.slow
def test_wmt14_en_de(tmp_path):
    fake_wmt_release(tmp_path / "wmt")
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-wmt14-en-de.sh", "--from", tmp_path / "wmt", "--out", out,
               "--bpe-merges", "200", "--workers", "2", "--max-lines", "401"])
    assert res.returncode == 0, res.stderr
    env = assert_databin(out, "en", "de")
    assert env["train_pairs"] == "401"  # first 401 of the concatenated corpora
    assert env["valid_set"] == "newstest2013" and env["valid_pairs"] == "41"
    assert env["test_set"] == "newstest2014" and env["test_pairs"] == "50"
    assert "<seg" not in (out / "text" / "test.raw.de").read_text()


def test_wmt14_missing_corpus(tmp_path):
    wmt = fake_wmt_release(tmp_path / "wmt")
    (wmt / "commoncrawl.de-en.de").unlink()
    out = tmp_path / "bin"
    res = run([SCRIPTS / "prepare-wmt14-en-de.sh", "--from", wmt, "--out", out])
    assert_failed_cleanly(res, out, "missing file", "commoncrawl.de-en.de")


# ----------------------------------------------------------------------------- significance
def test_significance_paired_bootstrap(tmp_path):
    ref, a, b = synthetic_pairs("en", "en", 121, seed=3)[0], [], []
    rng = random.Random(0)
    for sent in ref:
        words = sent.split()
        a.append(" ".join(w if rng.random() > 0.4 else "xx" for w in words))  # worse system
        b.append(" ".join(w if rng.random() > 0.1 else "xx" for w in words))
    for name, rows in (("ref", ref), ("a", a), ("b", b)):
        write_lines(tmp_path / name, rows)
    out = tmp_path / "sig"
    res = run([SCRIPTS / "significance.sh", "--ref", tmp_path / "ref", "--sys-a", tmp_path / "a",
               "--sys-b", tmp_path / "b", "--names", "base new", "--out", out])
    assert res.returncode == 0, res.stderr
    # the p-value and mark: sacreBLEU's paired bootstrap on the tokenized files, B against A
    assert "sacreBLEU paired bootstrap, 1000 samples, BLEU tok-cased, p against base" in res.stdout
    sig = json.loads((out / "significance.json").read_text())
    assert sig["new"]["bleu"] > sig["baseline"]["bleu"] and sig["new"]["p_value"] < 0.01
    assert sig["new"]["mark"] == "‡"
    assert any(line.split()[:2] == ["new", f"{sig['new']['bleu']:.2f}"] for line in res.stdout.splitlines() if line.strip())
    from sacrebleu.metrics import BLEU
    assert sig["new"]["bleu"] == round(BLEU(tokenize="none", force=True).corpus_score(b, [ref]).score, 2)
    report = (out / "report.txt").read_text()
    assert "Aggregate Scores" in report and "[10,20)" in report
    assert (out / "index.html").is_file()

    write_lines(tmp_path / "b", b[:-1])
    res = run([SCRIPTS / "significance.sh", "--ref", tmp_path / "ref", "--sys-a", tmp_path / "a",
               "--sys-b", tmp_path / "b", "--out", tmp_path / "sig2"])
    assert res.returncode != 0 and "mismatched line counts" in res.stderr
