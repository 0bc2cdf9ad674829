"""``fairseq-ext score`` (fairseq_ext/tools/score.py): a raw source and a raw reference in,
sacreBLEU in evaluate's four flavours with signatures out, the reported flavour chosen as
``fairseq-ext evaluate`` chooses it. The files are checked before the model loads (line
counts, a reference that is not UTF-8); the scores equal sacreBLEU's own on the written
translations, a skipped source line scored as an empty hypothesis. The model is
conftest's ``raw_text_model``."""
import re
import shutil
import sys

import pytest
import sacrebleu

from fairseq_ext.common.data_text import env_headline as choose_headline
from model_utils import MULTI30K
from script_utils import SENTENCE, fairseq_ext, head_gz, needs_multi30k, write_lines

FLAVOUR_LINE = re.compile(r"^(detok-cased|detok-lc|tok-cased|tok-lc) +BLEU\|(nrefs:1\|case:(mixed|lc)\|eff:no\|"
                          r"tok:(13a|none)\|smooth:exp\|version:[\d.]+) = ([\d.]+) ")
REPORTED = re.compile(r"^reported BLEU \[([a-z-]+)\].*: ([\d.]+)  signature: (nrefs:1\|case:\w+\|.*)$")


@pytest.fixture(scope="module")
def model(raw_text_model):
    return raw_text_model


def score(model, *args, data=None):
    default_data, checkpoint = model
    return fairseq_ext("score", "--checkpoint", checkpoint, "--data", data or default_data, "--cpu", "--beam", "2",
                       "--no-progress", *args)


def parse(stdout):
    """{flavour: (signature, score)} and (reported flavour, score, signature)."""
    flavours, reported = {}, None
    for line in stdout.splitlines():
        if m := FLAVOUR_LINE.match(line):
            flavours[m.group(1)] = (m.group(2), float(m.group(5)))
        elif m := REPORTED.match(line):
            reported = (m.group(1), float(m.group(2)), m.group(3))
    return flavours, reported


@pytest.mark.slow
@needs_multi30k
def test_score_equals_sacrebleu_on_the_written_translations(model, tmp_path):
    english, german = head_gz(f"{MULTI30K}/val.en.gz", 30), head_gz(f"{MULTI30K}/val.de.gz", 30)
    source = write_lines(tmp_path / "src.en", english)
    first = fairseq_ext("translate", "--checkpoint", model[1], "--data", model[0], "--cpu", "--beam", "2",
                        "--batch-size", "1", "--input", source)  # one sentence a batch: no batch's length limit
    assert first.returncode == 0, first.stderr[-3000:]
    # a reference that is the system's own output on every other line: a BLEU well above 0
    own = first.stdout.splitlines()
    reference = write_lines(tmp_path / "ref.de", [own[i] if i % 2 else german[i] for i in range(30)])
    raw = open(source, "rb").read().split(b"\n")
    raw[4] = b"caf\xe9 au lait"  # skipped: an empty hypothesis
    source.write_bytes(b"\n".join(raw))

    hyp = tmp_path / "hyp.de"
    res = score(model, "--src", source, "--ref", reference, "--output", hyp, "--batch-size", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    written = hyp.read_text(encoding="utf-8").split("\n")
    assert written[-1] == "" and len(written) == 31 and written[4] == ""
    assert written[:4] + written[5:30] == own[:4] + own[5:]  # translate's pipeline
    flavours, reported = parse(res.stdout)
    assert sorted(flavours) == ["detok-cased", "detok-lc", "tok-cased", "tok-lc"], res.stdout
    refs = reference.read_text(encoding="utf-8").splitlines()
    for flavour, lowercase in (("detok-cased", False), ("detok-lc", True)):
        expected = sacrebleu.corpus_bleu(written[:30], [refs], lowercase=lowercase)
        assert flavours[flavour][1] == round(expected.score, 2) > 10, (flavour, res.stdout)
    assert flavours["detok-cased"][0].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert flavours["tok-lc"][0].startswith("nrefs:1|case:lc|eff:no|tok:none")
    assert reported == ("detok-cased", flavours["detok-cased"][1], flavours["detok-cased"][0])  # Multi30k's
    # chrF, chrF++ and TER on the reported flavour's text, before the reported line
    lines = res.stdout.splitlines()
    chrf = [line for line in lines if line.startswith("chrF2 [detok-cased]")]
    assert len(chrf) == 1 and chrf[0].endswith(f" = {sacrebleu.corpus_chrf(written[:30], [refs]).score:.2f}")
    assert [line.split()[0] for line in lines[-4:]] == ["chrF2", "chrF2++", "TER", "reported"]
    assert any(line.endswith("line 5 is not valid UTF-8 (byte 0xe9 at column 4): skipped, an empty output line "
                             "in its place") for line in res.stderr.splitlines()), res.stderr
    assert "29 lines translated, 1 skipped (not UTF-8: line 5; each scored as an empty hypothesis), 0 cut" \
        in res.stderr


@pytest.mark.slow
@needs_multi30k
def test_lowercased_data_gets_a_lowercase_headline_and_headline_wins(model, tmp_path):
    data = tmp_path / "lowercased"
    shutil.copytree(model[0], data)
    prep = (data / "prep.env").read_text()
    assert "\nlowercase=0\n" in prep
    (data / "prep.env").write_text(prep.replace("\nlowercase=0\n", "\nlowercase=1\n"))
    # gzipped, as the corpora's release files
    source = write_lines(tmp_path / "src.en", [SENTENCE, "Two dogs play in the park."], gz=True)
    reference = write_lines(tmp_path / "ref.de", ["Ein Mann in einem roten Hemd fährt Fahrrad.",
                                                  "Zwei Hunde spielen im Park."], gz=True)
    res = score(model, "--src", source, "--ref", reference, data=data)
    assert res.returncode == 0, res.stderr[-3000:]
    flavours, reported = parse(res.stdout)
    assert reported[0] == "detok-lc" and reported[2].startswith("nrefs:1|case:lc|"), res.stdout
    assert "lowercased data" in res.stdout
    assert "2 lines translated, 0 skipped, 0 cut" in res.stderr
    res = score(model, "--src", source, "--ref", reference, "--headline", "tok-cased", data=data)
    assert res.returncode == 0, res.stderr[-3000:]
    assert parse(res.stdout)[1][0] == "tok-cased"


def test_the_headline_is_the_one_evaluate_reports():
    assert choose_headline({"recipe": "multi30k", "src": "en", "tgt": "de", "lowercase": "0"})[0] == "detok-cased"
    assert choose_headline({"recipe": "multi30k", "src": "en", "tgt": "de", "lowercase": "1"})[0] == "detok-lc"
    assert choose_headline({"recipe": "iwslt14", "src": "de", "tgt": "en", "lowercase": "1"})[0] == "tok-lc"
    assert choose_headline({"recipe": "iwslt14", "src": "es", "tgt": "en", "lowercase": "1"})[0] == "tok-lc"
    assert choose_headline({})[0] == "detok-cased"  # no prep.env
    assert choose_headline({"recipe": "multi30k", "lowercase": "1"}, "tok-cased") == ("tok-cased", "")


def test_line_counts_that_differ_are_one_line_error_before_the_model_loads(tmp_path):
    source = write_lines(tmp_path / "src.en", ["a", "b", "c"])
    reference = write_lines(tmp_path / "ref.de", ["a", "b"])
    res = fairseq_ext("score", "--checkpoint", tmp_path / "none.pt", "--data", tmp_path, "--src", source,
                      "--ref", reference)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"fairseq-ext score: error: --src {source} has 3 lines but --ref {reference} has 2: they must be parallel, "
        "one reference line per source line"]


def test_an_empty_test_set_is_one_line_error_before_the_model_loads(tmp_path):
    source, reference = tmp_path / "src.en", tmp_path / "ref.de"
    source.write_text("")
    reference.write_text("")
    res = fairseq_ext("score", "--checkpoint", tmp_path / "none.pt", "--data", tmp_path, "--src", source,
                      "--ref", reference)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        f"fairseq-ext score: error: --src {source} and --ref {reference} are empty: nothing to score"]


def test_a_reference_line_that_is_not_utf8_is_an_error_naming_the_file_and_line(tmp_path):
    source = write_lines(tmp_path / "src.en", ["a", "b"])
    reference = tmp_path / "ref.de"
    reference.write_bytes(b"a\nb\xff\n")
    res = fairseq_ext("score", "--checkpoint", tmp_path / "none.pt", "--data", tmp_path, "--src", source,
                      "--ref", reference)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"fairseq-ext score: error: --ref {reference}: line 2 is not valid UTF-8 (byte 0xff at column 2): "
        "a reference line cannot be skipped"]


@pytest.mark.slow
@needs_multi30k
def test_output_that_is_the_checkpoint_or_the_reference_is_refused(model, tmp_path):
    data, checkpoint = model
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("A dog runs.\n")
    ref.write_text("Ein Hund rennt.\n")
    before = checkpoint.read_bytes()
    for output, message in [(checkpoint, "is the checkpoint"), (ref, "is the --ref file")]:
        res = score(model, "--src", src, "--ref", ref, "--output", output)
        assert res.returncode == 1 and f"fairseq-ext score: error: --output {output} {message}" in res.stderr
    assert checkpoint.read_bytes() == before and ref.read_text() == "Ein Hund rennt.\n"


@pytest.mark.slow
@needs_multi30k
def test_src_and_ref_may_be_pipes(model, tmp_path):
    """`--src <(...) --ref <(...)`: pipes are read (once), as files are."""
    import subprocess

    from model_utils import clean_env
    data, checkpoint = model
    cmd = (f"{sys.executable} -m fairseq_ext score --checkpoint {checkpoint} --data {data} --cpu --beam 2 "
           "--no-progress --src <(printf 'A dog runs.\\nTwo men.\\n') "
           "--ref <(printf 'Ein Hund rennt.\\nZwei Maenner.\\n')")
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=clean_env(), timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "BLEU" in res.stdout


def test_a_data_directory_that_does_not_exist_is_one_line(tmp_path):
    source = write_lines(tmp_path / "src.en", ["a"])
    res = fairseq_ext("score", "--checkpoint", tmp_path / "none.pt", "--data", tmp_path / "nowhere", "--src", source,
                      "--ref", source)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        f"fairseq-ext score: error: --data {tmp_path / 'nowhere'}: no such directory"]
    # a data directory without prep.env or dictionaries: the error alone, no warning about prep.env first
    (tmp_path / "empty").mkdir()
    res = fairseq_ext("score", "--checkpoint", tmp_path / "none.pt", "--data", tmp_path / "empty", "--src", source,
                      "--ref", source)
    assert res.returncode == 1 and res.stderr.strip().splitlines() == [
        f"fairseq-ext score: error: --checkpoint {tmp_path / 'none.pt'}: no such file"]
