"""fairseq_ext.tools.significance: sacreBLEU's paired tests in the papers' BLEU flavours and marks,
checked against the sacrebleu command line on the same files."""
import json
import os
import random
import re
import subprocess
import sys

import pytest

from fairseq_ext.tools.significance import paired_significance
from fairseq_ext.tools.statistics import FLAVOURS, MARKS, mark
from model_utils import REPO


def corpus(n=121, seed=0):
    """A reference, a system close to it and one far from it (n not a multiple of 8)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(60)] + ["The", "the", "A", "a", "."]
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(n)]

    def noisy(p):
        out = []
        for line in refs:
            toks = [t if rng.random() > p else rng.choice(words) for t in line.split()]
            out.append(" ".join(toks))
        return out

    return refs, noisy(0.35), noisy(0.15), noisy(0.36)


def sacrebleu_cli(tmp_path, refs, systems, extra):
    paths = []
    for name, lines in [("ref", refs), *systems]:
        p = tmp_path / f"{name}.txt"
        p.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(str(p))
    env = dict(os.environ, SACREBLEU_SEED="12345")
    cmd = [os.path.join(os.path.dirname(sys.executable), "sacrebleu"), paths[0], "-i", *paths[1:], "-m", "bleu",
           "--format", "json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("flavour, extra", [("detok-cased", []), ("tok-lc", ["-tok", "none", "-lc", "--force"])])
def test_paired_bootstrap_equals_the_sacrebleu_command(tmp_path, flavour, extra):
    refs, base, better, same = corpus()
    ours = paired_significance(refs, base, {"better": better, "same": same}, flavour=flavour, n_samples=200)
    cli = sacrebleu_cli(tmp_path, refs, [("base", base), ("better", better), ("same", same)],
                        ["--paired-bs", "--paired-bs-n", "200", *extra])
    for name, entry in zip(["baseline", "better", "same"], cli):
        assert ours[name]["bleu"] == pytest.approx(entry["BLEU"]["score"], abs=0.005)
        if name != "baseline":
            assert ours[name]["p_value"] == pytest.approx(entry["BLEU"]["p_value"], abs=1e-4)
            assert ours[name]["mean"] == pytest.approx(entry["BLEU"]["mean"], abs=0.005)
    assert ours["better"]["p_value"] < 0.01 and ours["better"]["mark"] == "‡"
    assert ours["same"]["p_value"] > 0.05 and ours["same"]["mark"] == ""


def test_approximate_randomization_and_identical_systems(tmp_path):
    refs, base, better, _ = corpus(seed=3)
    ours = paired_significance(refs, base, {"copy": list(base), "better": better}, method="ar", n_samples=300)
    cli = sacrebleu_cli(tmp_path, refs, [("base", base), ("copy", base), ("better", better)],
                        ["--paired-ar", "--paired-ar-n", "300"])
    assert ours["better"]["p_value"] == pytest.approx(cli[2]["BLEU"]["p_value"], abs=1e-4)
    # sacreBLEU itself calls an identical system significant (p = 1/(n+1)); we do not
    assert cli[1]["BLEU"]["p_value"] == pytest.approx(1 / 301)
    assert ours["copy"]["p_value"] == 1.0 and ours["copy"]["mark"] == ""
    boot = paired_significance(refs, base, {"copy": list(base)}, method="bs", n_samples=50)
    assert boot["copy"]["p_value"] == 1.0 and boot["copy"]["mark"] == ""


def test_seed_reproducible_and_flavours_differ():
    refs, base, better, same = corpus(seed=5)
    a = paired_significance(refs, base, {"s": same}, n_samples=100, seed=7)
    b = paired_significance(refs, base, {"s": same}, n_samples=100, seed=7)
    c = paired_significance(refs, base, {"s": same}, n_samples=100, seed=8)
    assert a == b and a["s"]["p_value"] != c["s"]["p_value"]
    upper = [r.upper() for r in refs]
    cased = paired_significance(upper, base, {"s": same}, flavour="tok-cased", n_samples=10)
    lower = paired_significance(upper, base, {"s": same}, flavour="tok-lc", n_samples=10)
    assert cased["baseline"]["bleu"] < lower["baseline"]["bleu"]


def test_marks_follow_each_papers_convention():
    assert [mark(p, "thesis") for p in (0.005, 0.03, 0.2, None)] == ["‡", "†", "", ""]
    assert [mark(p, "mma") for p in (0.005, 0.03)] == ["††", "†"]
    assert [mark(p, "wt") for p in (0.005, 0.03)] == ["†", "‡"]  # reversed in that paper
    assert set(MARKS) >= {"thesis", "mlmha", "mma", "wt"}


def test_score_bleu_uses_the_same_flavours(tmp_path):
    """evaluate.sh's scorer gives the corpus BLEU paired_significance reports, per flavour."""
    refs, base, better, _ = corpus(seed=9)
    (tmp_path / "ref").write_text("\n".join(refs) + "\n")
    (tmp_path / "hyp").write_text("\n".join(better) + "\n")
    subprocess.run([sys.executable, os.path.join(REPO, "fairseq_ext", "standalone", "bleu.py"), "--hyp-detok",
                    str(tmp_path / "hyp"), "--ref-detok", str(tmp_path / "ref"), "--hyp-tok", str(tmp_path / "hyp"),
                    "--ref-tok", str(tmp_path / "ref"), "--json", str(tmp_path / "s.json")], check=True,
                   capture_output=True)
    scores = json.loads((tmp_path / "s.json").read_text())
    for flavour in FLAVOURS:
        ours = paired_significance(refs, better, {"x": base}, flavour=flavour, n_samples=10)["baseline"]["bleu"]
        assert scores[flavour]["score"] == pytest.approx(ours, abs=0.01), flavour


def test_errors_name_the_problem():
    refs, base, better, _ = corpus(n=9)
    with pytest.raises(ValueError, match="has 8 lines but the reference has 9"):
        paired_significance(refs, base, {"x": better[:-1]})
    with pytest.raises(ValueError, match="--flavour"):
        paired_significance(refs, base, {"x": better}, flavour="chrf")
    with pytest.raises(ValueError, match="--method"):
        paired_significance(refs, base, {"x": better}, method="perm")


def test_a_short_or_empty_file_is_one_line_naming_it(tmp_path):
    refs, base, better, _ = corpus(n=9)
    for name, lines in (("ref", refs), ("a", base), ("short", better[:-1]), ("empty", [])):
        (tmp_path / name).write_text("".join(line + "\n" for line in lines))
    for ref, system, count in (("ref", "short", 8), ("ref", "empty", 0), ("empty", "empty", 0)):
        res = subprocess.run([sys.executable, "-m", "fairseq_ext.tools.significance", "--ref", tmp_path / ref,
                              "--baseline", tmp_path / ref, "--system", f"x={tmp_path / system}"],
                             capture_output=True, text=True)
        n = 0 if ref == "empty" else 9
        assert res.returncode == 1 and res.stderr.splitlines() == [
            "significance.py: error: the files must have as many lines as the reference, at least one: "
            f"--ref {tmp_path / ref} has {n}, --baseline {tmp_path / ref} has {n}, --system x={tmp_path / system} has "
            f"{count}"], res.stderr


def test_compare_mt_bleu_can_name_the_other_winner():
    """Why the marks come from sacreBLEU: compare-mt's BLEU treats a zero n-gram precision as 1.
    A has no matching 4-gram (as undertrained systems often do): compare-mt scores it 38.88 and
    ranks it first; its true BLEU (sacreBLEU) is 16.10, below C's 22.84."""
    from fairseq_ext.standalone import compare_mt_shim

    compare_mt_shim._install_six_stub()
    from compare_mt import scorers
    from sacrebleu.metrics import BLEU

    refs = ["the cat sat on the mat today", "a dog ran in the park with joy", "we went home after the long game",
            "she reads books in the quiet room"]
    a = ["the cat on the mat sat today", "a dog in the park ran joy with", "we home went the after game long",
         "she books reads the in room quiet"]
    c = ["the cat sat on the mat today", "q w e r t y u i", "z x c v b n m o", "k l j h g f d"]
    cmt = scorers.create_scorer_from_profile("bleu")
    cm = {n: cmt.score_corpus([r.split() for r in refs], [h.split() for h in hyps])[0] for n, hyps in (("a", a), ("c", c))}
    sb = {n: BLEU(tokenize="none", force=True).corpus_score(hyps, [refs]) for n, hyps in (("a", a), ("c", c))}
    assert sb["a"].counts[3] == 0
    assert cm["a"] == pytest.approx(38.88, abs=0.01) and cm["c"] == pytest.approx(22.84, abs=0.01)
    assert sb["a"].score == pytest.approx(16.10, abs=0.01) and sb["c"].score == pytest.approx(22.84, abs=0.01)
    assert (cm["a"] > cm["c"]) != (sb["a"].score > sb["c"].score)


def test_no_bootstrap_sample_is_refused(tmp_path):
    """--samples 0 would make sacreBLEU report p = 1.0 under a signature saying bs:1000: the
    function, the multi-system command and `fairseq-ext significance` refuse it in one line."""
    refs, hyp = ["a b c d"] * 3, ["a b c d"] * 3
    with pytest.raises(ValueError, match="--samples must be at least 1, not 0"):
        paired_significance(refs, hyp, {"x": hyp}, n_samples=0)
    for name, text in (("ref", refs), ("a", hyp), ("b", hyp)):
        (tmp_path / name).write_text("\n".join(text) + "\n")
    res = subprocess.run([sys.executable, "-m", "fairseq_ext", "significance", "--ref", tmp_path / "ref",
                          "--sys-a", tmp_path / "a", "--sys-b", tmp_path / "b", "--out", tmp_path / "out",
                          "--samples", "0"], capture_output=True, text=True)
    errors = [line for line in res.stderr.splitlines() if "error" in line]
    assert res.returncode != 0 and errors == [errors[0]] and "--samples must be at least 1, not 0" in errors[0], \
        res.stderr
    assert not (tmp_path / "out").exists()
    res = subprocess.run([sys.executable, "-m", "fairseq_ext.tools.significance", "--ref", tmp_path / "ref",
                          "--baseline", tmp_path / "a", "--system", f"b={tmp_path / 'b'}", "--samples", "0"],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "--samples must be at least 1, not 0" in res.stderr and "Traceback" not in res.stderr


def test_a_failing_compare_mt_keeps_the_sacrebleu_result(tmp_path):
    """compare-mt's figures fail on tiny inputs (3 sentences); its analyses are extras, so the
    p-value is still written and the failure is one warning line."""
    ref = ["the cat sat on the mat", "a dog ran in the park", "we went home late"]
    a = ["the cat sat on a mat", "a dog ran in a park", "we went home"]
    b = ["the cat sat on the mat", "a dog ran in the park", "we went home late"]
    for name, text in (("ref", ref), ("a", a), ("b", b)):
        (tmp_path / name).write_text("\n".join(text) + "\n")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "fairseq_ext", "significance", "--ref", tmp_path / "ref",
                          "--sys-a", tmp_path / "a", "--sys-b", tmp_path / "b", "--out", out, "--samples", "50"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads((out / "significance.json").read_text())
    assert result["B"]["p_value"] is not None
    warnings = [line for line in res.stderr.splitlines() if "compare-mt failed" in line]
    assert len(warnings) == 1 and "the sacreBLEU result is kept" in warnings[0] and "yerr" in warnings[0]
    assert "Traceback" not in res.stderr and not (out / "index.html").exists()


def test_pipes_are_read_once_and_compared_as_files_are(tmp_path):
    """``--ref <(...)`` and friends: a pipe can be read once, and the command reads its inputs
    twice (checked, then scored); the pipes give the same result as the files."""
    refs, base, better, _ = corpus(n=37)
    for name, text in (("ref", refs), ("a", base), ("b", better)):
        (tmp_path / name).write_text("\n".join(text) + "\n")
    command = (f'"$PYTHON" -m fairseq_ext significance --samples 20 --out "$1" --ref {{ref}} --sys-a {{a}} '
               f'--sys-b {{b}} 2>/dev/null')
    results = []
    for name, how in (("files", '"$2/{}"'), ("pipes", '<(cat "$2/{}")')):
        line = command.format(ref=how.format("ref"), a=how.format("a"), b=how.format("b"))
        res = subprocess.run(["bash", "-c", line, "significance", tmp_path / name, tmp_path],
                             capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable))
        assert res.returncode == 0, res.stdout + res.stderr
        results.append(json.loads((tmp_path / name / "significance.json").read_text()))
    assert results[0] == results[1]
    # every metric evaluate prints is tested, with its own p-value and mark
    assert list(results[0]["B"]["metrics"]) == ["chrF2", "chrF2++", "TER"]
    assert all("p_value" in m and "mark" in m for m in results[0]["B"]["metrics"].values())
    text = (tmp_path / "files" / "significance.txt").read_text()
    assert "chrF2++ tok-cased, p against A" in text and "TER tok-cased (lower is better)" in text


def test_each_metric_is_tested_as_the_sacrebleu_command_tests_it(tmp_path):
    """chrF2, chrF2++ and TER tested in the same call as BLEU, each with its p-value and mark,
    equal to `sacrebleu -m bleu chrf ter --paired-bs` on the same files (TER: lower is better)."""
    from fairseq_ext.tools.significance import table_lines

    refs, base, better, same = corpus()
    ours = paired_significance(refs, base, {"better": better, "same": same}, n_samples=200,
                               metrics=("BLEU", "chrF2", "chrF2++", "TER"))
    assert list(ours["better"]["metrics"]) == ["chrF2", "chrF2++", "TER"]
    systems = [("base", base), ("better", better), ("same", same)]
    sacrebleu_cli(tmp_path, refs, systems, [])  # writes the files

    def command_result(*metric):
        """(scores, p-values) of the command's text table (its JSON cannot hold chrF's and
        TER's float32 results)."""
        cmd = [os.path.join(os.path.dirname(sys.executable), "sacrebleu"), str(tmp_path / "ref.txt"), "-i",
               *(str(tmp_path / f"{n}.txt") for n, _ in systems), *metric, "--paired-bs", "--paired-bs-n", "200",
               "--format", "text", "-w", "4"]
        text = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, SACREBLEU_SEED="12345"),
                              check=True).stdout
        scores = [float(x) for x in re.findall(r"│\s+(?:Baseline: )?\S+\s+│\s+([0-9.]+) \(", text)]
        return scores, [None] + [float(x) for x in re.findall(r"\(p = ([0-9.]+)\)", text)]

    theirs = {"chrF2": command_result("-m", "chrf"), "chrF2++": command_result("-m", "chrf", "--chrf-word-order", "2"),
              "TER": command_result("-m", "ter", "--ter-case-sensitive")}
    for k, name in enumerate(["baseline", "better", "same"]):
        for metric, (scores, ps) in theirs.items():
            assert ours[name]["metrics"][metric]["score"] == pytest.approx(scores[k], abs=0.00501), (name, metric)
            if name != "baseline":
                assert ours[name]["metrics"][metric]["p_value"] == pytest.approx(ps[k], abs=1e-4), (name, metric)
    assert ours["better"]["metrics"]["chrF2"]["mark"] == "‡" and ours["same"]["metrics"]["TER"]["mark"] == ""
    lines = table_lines(ours, method="bs", n_samples=200, flavour="detok-cased")
    assert "sacreBLEU paired bootstrap, 200 samples, TER detok-cased (lower is better), p against baseline" in lines
    assert sum(line.startswith("signature: ") for line in lines) == 4
    # BLEU alone: the result and its table as before, without a metrics key
    assert "metrics" not in paired_significance(refs, base, {"better": better}, n_samples=20)["better"]
