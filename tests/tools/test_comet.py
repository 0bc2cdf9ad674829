"""COMET beside sacreBLEU (fairseq_ext/tools/comet.py), for real: a tiny COMET model that the
test builds locally (tests/tools/comet_tiny_model.py: random weights, a 2-layer XLM-R encoder,
a sentencepiece vocabulary learnt from Multi30k lines), loaded and run by COMET's own code in
the COMET environment (``make comet-env``, or ``$FAIRSEQ_EXT_COMET_PYTHON``); no mock of
COMET. Our system scores, segment scores and paired tests equal those of COMET's own commands
(``comet-score``, ``comet-compare``) on the same files. Without that environment those tests
are skipped with the reason; the one-line errors are tested always."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from fairseq_ext.tools import comet
from model_utils import MULTI30K, REPO
from script_utils import fairseq_ext, head_gz, needs_multi30k, write_lines

COMET_PYTHON = os.environ.get(comet.ENV_PYTHON) or os.path.join(REPO, ".comet-venv", "bin", "python")
needs_comet = pytest.mark.skipif(not os.path.exists(COMET_PYTHON),
                                 reason=f"no COMET environment ({COMET_PYTHON}): make comet-env makes one")
BUILDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "comet_tiny_model.py")


@pytest.fixture(scope="module")
def tiny_comet(tmp_path_factory):
    root = tmp_path_factory.mktemp("comet")
    text = write_lines(root / "text.txt", head_gz(f"{MULTI30K}/train.en.gz", 300) + head_gz(f"{MULTI30K}/train.de.gz", 300))
    model = root / "tiny-comet"
    proc = subprocess.run([COMET_PYTHON, BUILDER, str(model), str(text)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(model)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """13 Multi30k validation sentences: source, reference, and two systems (the reference
    with a word dropped from every other line, and the reference's words reversed)."""
    root = tmp_path_factory.mktemp("comet_texts")
    src, ref = head_gz(f"{MULTI30K}/val.en.gz", 13), head_gz(f"{MULTI30K}/val.de.gz", 13)
    a = [" ".join(r.split()[1:]) if i % 2 else r for i, r in enumerate(ref)]
    b = [" ".join(reversed(r.split())) for r in ref]
    return SimpleNamespace(**{name: (lines, str(write_lines(root / f"{name}.txt", lines)))
                              for name, lines in (("src", src), ("ref", ref), ("a", a), ("b", b))})


def settings(model):
    args = SimpleNamespace(comet_model=model, comet_python=COMET_PYTHON, comet_batch_size=4, cpu=True)
    return comet.from_args(args)


def comet_command(command, *args):
    proc = subprocess.run([COMET_PYTHON, "-c", f"from comet.cli.{command} import {command}_command; "
                                               f"{command}_command()", *map(str, args)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@needs_comet
@needs_multi30k
def test_the_system_and_segment_scores_are_comet_scores(tiny_comet, texts, tmp_path):
    ours = comet.score(settings(tiny_comet), texts.src[0], texts.a[0], texts.ref[0])
    out = tmp_path / "comet.json"
    stdout = comet_command("score", "-s", texts.src[1], "-t", texts.a[1], "-r", texts.ref[1], "--model",
                           os.path.join(tiny_comet, "checkpoints", "model.ckpt"), "--gpus", "0", "--batch_size", "4",
                           "--to_json", out)
    theirs = [segment["COMET"] for segment in json.loads(out.read_text())[texts.a[1]]]
    assert ours["segment_scores"] == pytest.approx(theirs, abs=1e-6)
    assert f"score: {ours['score']:.4f}" in stdout.splitlines()[-2]  # comet-score's system line
    version = subprocess.run([COMET_PYTHON, "-c", "from importlib.metadata import version; "
                                                  "print(version('unbabel-comet'))"],
                             capture_output=True, text=True).stdout.strip()
    assert ours["signature"] == f"model:tiny-comet|nrefs:1|case:mixed|version:{version}"
    assert ours["line"] == f"COMET|model:tiny-comet|nrefs:1|case:mixed|version:{version} = {ours['score']:.4f}"
    lowered = comet.score(settings(tiny_comet), texts.src[0], texts.a[0], texts.ref[0], lowercase=True)
    assert lowered["signature"] == f"model:tiny-comet|nrefs:1|case:lc|version:{version}"  # not comparable
    # another system gets another score: the model reads the translations
    assert comet.score(settings(tiny_comet), texts.src[0], texts.b[0], texts.ref[0])["score"] != ours["score"]


@needs_comet
@needs_multi30k
def test_the_paired_test_is_comet_compares(tiny_comet, texts, tmp_path):
    ours = comet.compare(settings(tiny_comet), texts.src[0], texts.a[0], texts.b[0], texts.ref[0], num_splits=50)
    out = tmp_path / "compare.json"
    comet_command("compare", "-s", texts.src[1], "-t", texts.a[1], texts.b[1], "-r", texts.ref[1], "--model",
                  os.path.join(tiny_comet, "checkpoints", "model.ckpt"), "--gpus", "0", "--batch_size", "4",
                  "--num_splits", "50", "--sample_ratio", "0.4", "--to_json", out)
    theirs = json.loads(out.read_text())["statistical_results"][0]
    assert ours["p_value"] == pytest.approx(theirs["paired_t-test"]["p_value"], abs=1e-9)
    assert ours["baseline_mean"] == pytest.approx(theirs["bootstrap_resampling"]["x-mean"], abs=1e-9)
    assert ours["system_wins"] == theirs["bootstrap_resampling"]["y_wins (%)"]


@pytest.mark.slow
@needs_comet
@needs_multi30k
def test_fairseq_ext_score_prints_a_comet_line_with_its_signature(tiny_comet, raw_text_model, tmp_path):
    data, checkpoint = raw_text_model
    src = write_lines(tmp_path / "src.en", head_gz(f"{MULTI30K}/val.en.gz", 13))
    ref = write_lines(tmp_path / "ref.de", head_gz(f"{MULTI30K}/val.de.gz", 13))
    hyp = tmp_path / "hyp.de"
    res = fairseq_ext("score", "--checkpoint", checkpoint, "--data", data, "--cpu", "--beam", "2", "--no-progress",
                      "--src", src, "--ref", ref, "--output", hyp, "--comet-model", tiny_comet,
                      "--comet-python", COMET_PYTHON, "--comet-batch-size", "4")
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines[-5:]] == ["chrF2", "chrF2++", "TER", "COMET", "reported"]
    expected = comet.score(settings(tiny_comet), open(src).read().splitlines(), hyp.read_text().splitlines(),
                           open(ref).read().splitlines())
    assert lines[-2] == f"COMET [detok-cased]       {expected['line']}"


def test_a_python_without_comet_is_one_line_before_the_model_loads(tmp_path):
    src = write_lines(tmp_path / "src.en", ["a house"])
    ref = write_lines(tmp_path / "ref.de", ["ein Haus"])
    model = tmp_path / "model"
    (model / "checkpoints").mkdir(parents=True)
    (model / "checkpoints" / "model.ckpt").write_bytes(b"")
    res = fairseq_ext("score", "--checkpoint", tmp_path / "missing.pt", "--data", tmp_path, "--cpu", "--src", src,
                      "--ref", ref, "--comet-model", model, "--comet-python", sys.executable)
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1].startswith(f"fairseq-ext score: error: --comet-python {sys.executable}: "
                                                          "no unbabel-comet there"), res.stderr
    assert "make comet-env" in res.stderr
    res = fairseq_ext("score", "--checkpoint", tmp_path / "missing.pt", "--data", tmp_path, "--cpu", "--src", src,
                      "--ref", ref, "--comet-model", tmp_path, "--comet-python", sys.executable)
    assert f"--comet-model {tmp_path}: no checkpoints/model.ckpt in it" in res.stderr, res.stderr


@pytest.mark.slow
@needs_comet
@needs_multi30k
def test_fairseq_ext_evaluate_writes_comet_beside_chrf(tiny_comet, raw_text_model, tmp_path):
    data, checkpoint = raw_text_model
    out = tmp_path / "eval"
    res = fairseq_ext("evaluate", "--checkpoint", checkpoint, "--data", data, "--out", out, "--cpu", "--beam", "2",
                      "--comet-model", tiny_comet, "--comet-python", COMET_PYTHON, "--comet-batch-size", "4")
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    src = (data / "text" / "test.raw.en").read_text().splitlines()
    expected = comet.score(settings(tiny_comet), src, (out / "hyp.detok").read_text().splitlines(),
                           (out / "ref.detok").read_text().splitlines())
    assert metrics["COMET"]["score"] == expected["score"] and len(metrics["COMET"]["segment_scores"]) == len(src)
    assert f"COMET [detok-cased]       {expected['line']}" in res.stdout.splitlines()
    assert "chrF2" in metrics


@needs_comet
@needs_multi30k
def test_fairseq_ext_significance_tests_comet_with_comet_compare(tiny_comet, texts, tmp_path):
    out = tmp_path / "sig"
    # the source as a pipe: read once, for sacreBLEU, compare-mt and COMET
    res = fairseq_ext("significance", "--ref", texts.ref[1], "--sys-a", texts.a[1], "--sys-b", texts.b[1],
                      "--src", "/dev/stdin", "--names", "base sys", "--samples", "100", "--out", out, "--cpu",
                      "--comet-model", tiny_comet, "--comet-python", COMET_PYTHON, "--comet-batch-size", "4",
                      "--comet-splits", "50", stdin="\n".join(texts.src[0]) + "\n")
    assert res.returncode == 0, res.stderr[-3000:]
    found = json.loads((out / "significance.json").read_text())["sys"]["comet"]
    expected = comet.compare(settings(tiny_comet), texts.src[0], texts.a[0], texts.b[0], texts.ref[0], num_splits=50)
    assert found["p_value"] == pytest.approx(expected["p_value"], abs=1e-12)
    assert found["mark"] == ("‡" if found["p_value"] < 0.01 else "†" if found["p_value"] < 0.05 else "")
    text = (out / "significance.txt").read_text()
    assert "COMET (comet-compare: paired t-test" in text and f"signature: {expected['signature']}" in text
    # the source is required for COMET: one line before anything runs
    res = fairseq_ext("significance", "--ref", texts.ref[1], "--sys-a", texts.a[1], "--sys-b", texts.b[1],
                      "--out", tmp_path / "sig2", "--comet-model", tiny_comet, "--comet-python", COMET_PYTHON)
    assert res.returncode != 0 and "--comet-model needs --src" in res.stderr.strip().splitlines()[-1]


@needs_comet
@needs_multi30k
def test_reproduce_scores_a_finished_run_with_comet_once(tiny_comet, texts, tmp_path, capsys):
    """The table runner's COMET step (fairseq-ext reproduce --comet-model): the data's raw
    source, eval-test's detokenized files; comet.json is reused while the signature holds."""
    from fairseq_ext.reproduce import execute
    from fairseq_ext.reproduce.planning import AnalysisPlan

    data, run_dir = tmp_path / "data", tmp_path / "run"
    (data / "text").mkdir(parents=True)
    (data / "prep.env").write_text("src=en\ntgt=de\n")
    write_lines(data / "text" / "test.raw.en", texts.src[0])
    write_lines(run_dir / "eval-test" / "hyp.detok", texts.a[0])
    write_lines(run_dir / "eval-test" / "ref.detok", texts.ref[0])
    run = SimpleNamespace(table="t", row="r", dataset="d", where="[t/r/d]", run_dir=str(run_dir), data_dir=str(data),
                          bleu="detok-cased")
    ap = AnalysisPlan("comet", run, str(run_dir / "comet.json"), comet=settings(tiny_comet))
    found = execute.run_comet(ap)
    assert found["score"] == comet.score(settings(tiny_comet), texts.src[0], texts.a[0], texts.ref[0])["score"]
    assert json.loads((run_dir / "comet.json").read_text())["signature"] == ap.comet.signature()
    (run_dir / "eval-test" / "hyp.detok").unlink()  # reused: not computed again
    assert execute.run_comet(ap)["score"] == found["score"]


def test_reproduce_takes_comet_from_the_evaluation_when_it_scored_it(tmp_path):
    """With $FAIRSEQ_EXT_COMET_MODEL the runner's evaluate commands score COMET too: the COMET
    step reads their metrics.json (same signature and flavour) instead of scoring again."""
    from fairseq_ext.reproduce import execute
    from fairseq_ext.reproduce.planning import AnalysisPlan

    settings_ = comet.Comet(python="/nonexistent/python", version="2.2.7", model="m.ckpt", name="m")
    (tmp_path / "eval-test").mkdir()
    entry = {"score": 0.5, "signature": settings_.signature(), "flavour": "detok-cased", "line": "COMET|..."}
    (tmp_path / "eval-test" / "metrics.json").write_text(json.dumps({"COMET": entry}))
    run = SimpleNamespace(table="t", row="r", dataset="d", where="[t/r/d]", run_dir=str(tmp_path),
                          data_dir=str(tmp_path), bleu="detok-cased")
    ap = AnalysisPlan("comet", run, str(tmp_path / "comet.json"), comet=settings_)
    assert execute.run_comet(ap)["score"] == 0.5  # not run: that Python does not exist
    assert json.loads((tmp_path / "comet.json").read_text())["score"] == 0.5


def test_the_signature_names_the_casing_so_a_lowercased_score_is_never_taken_for_a_cased_one(tmp_path):
    settings_ = comet.Comet(python="/nonexistent/python", version="2.2.7", model="m.ckpt", name="m")
    assert settings_.signature() == "model:m|nrefs:1|case:mixed|version:2.2.7"
    assert settings_.signature(lowercase=True) == "model:m|nrefs:1|case:lc|version:2.2.7"
    from fairseq_ext.reproduce import execute
    from fairseq_ext.reproduce.planning import AnalysisPlan

    # a cased score kept by an earlier step is not the score of a lowercased table: scored again
    (tmp_path / "comet.json").write_text(json.dumps({"score": 0.5, "signature": settings_.signature()}))
    run = SimpleNamespace(table="t", row="r", dataset="d", where="[t/r/d]", run_dir=str(tmp_path),
                          data_dir=str(tmp_path), bleu="tok-lc")
    ap = AnalysisPlan("comet", run, str(tmp_path / "comet.json"), comet=settings_)
    with pytest.raises(Exception):  # it tries to score (and that Python does not exist)
        execute.run_comet(ap)


def test_comet_failures_are_one_line_that_says_why(tmp_path, monkeypatch):
    """A Python that prints no version (/bin/true) is refused before anything runs; a failure's
    line is the exception's, not a traceback's caret; a model folder is passed absolute (the
    worker runs in a folder of its own)."""
    with pytest.raises(comet.CometError, match=r"--comet-python /bin/true: no unbabel-comet there \(it printed no "
                                               r"version\)"):
        comet.comet_version("/bin/true", "--comet-python")
    traceback = ('Traceback (most recent call last):\n  File "<string>", line 3, in <module>\n'
                 '    load_from_checkpoint(path)\n    ^^^^^^^^^^^^^^^^^^^^^^^^^^\n'
                 'FileNotFoundError: [Errno 2] No such file: model.ckpt\n      ^\n')
    assert comet.failure_line(traceback) == "FileNotFoundError: [Errno 2] No such file: model.ckpt"
    model = tmp_path / "tiny" / "checkpoints"
    model.mkdir(parents=True)
    (model / "model.ckpt").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert comet.resolve_model("tiny") == str(model / "model.ckpt")
    assert comet.resolve_model("Unbabel/wmt22-comet-da") == "Unbabel/wmt22-comet-da"  # a name COMET downloads
