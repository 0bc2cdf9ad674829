"""chrF, chrF++ and TER beside BLEU (fairseq_ext/standalone/bleu.py, as evaluate and score
print them): the numbers and signatures of the sacrebleu command on the same files, on the
text of the reported flavour (a lowercased flavour scores them case-insensitive)."""
import json
import os
import random
import subprocess
import sys

import pytest

from fairseq_ext.standalone import bleu

WORDS = ["The", "the", "a", "A", "cat", "dog", "sat", "on", "mat", "red", "runs", "."]


def corpus(n=37, seed=0):
    rng = random.Random(seed)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]
    hyps = [" ".join(w if rng.random() > 0.3 else rng.choice(WORDS) for w in r.split()) for r in refs]
    return hyps, refs


def sacrebleu_cli(hyp, ref, *options):
    cmd = [os.path.join(os.path.dirname(sys.executable), "sacrebleu"), str(ref), "-i", str(hyp), "-m", "chrf", "ter",
           "--format", "json", "-w", "2", *options]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("flavour", ["detok-cased", "detok-lc"])
def test_chrf_chrf_plus_plus_and_ter_equal_the_sacrebleu_command(tmp_path, flavour):
    hyps, refs = corpus()
    for name, lines in (("hyp", hyps), ("ref", refs)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    results = bleu.score(str(tmp_path / "hyp"), str(tmp_path / "ref"))
    metrics = bleu.more_metrics(results, flavour)
    assert list(metrics) == ["chrF2", "chrF2++", "TER"]
    lc = flavour.endswith("-lc")
    chrf = sacrebleu_cli(tmp_path / "hyp", tmp_path / "ref", *(["--chrf-lowercase"] if lc else []))
    plus = sacrebleu_cli(tmp_path / "hyp", tmp_path / "ref", "--chrf-word-order", "2",
                         *(["--chrf-lowercase"] if lc else []))
    ter = sacrebleu_cli(tmp_path / "hyp", tmp_path / "ref", *([] if lc else ["--ter-case-sensitive"]))
    assert metrics["chrF2"]["score"] == pytest.approx(chrf[0]["score"], abs=0.006)
    assert metrics["chrF2"]["signature"] == chrf[0]["signature"]
    assert metrics["chrF2++"]["score"] == pytest.approx(plus[0]["score"], abs=0.006)
    assert metrics["chrF2++"]["signature"] == plus[0]["signature"]
    assert metrics["TER"]["score"] == pytest.approx(ter[1]["score"], abs=0.006)
    assert metrics["TER"]["signature"] == ter[1]["signature"]
    # cased and lowercased differ on this text (it mixes The/the)
    other = bleu.more_metrics(results, "detok-cased" if lc else "detok-lc")
    assert other["chrF2"]["score"] != metrics["chrF2"]["score"]
    lines = bleu.metric_lines(metrics)
    assert lines[0].startswith(f"chrF2 [{flavour}]") and metrics["chrF2"]["signature"] in lines[0]
    assert lines[2].startswith(f"TER [{flavour}]")


def test_the_bleu_command_prints_them_before_the_reported_line(tmp_path):
    hyps, refs = corpus(n=13)
    for name, lines in (("hyp", hyps), ("ref", refs)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = subprocess.run([sys.executable, bleu.__file__, "--hyp-detok", str(tmp_path / "hyp"), "--ref-detok",
                          str(tmp_path / "ref"), "--headline", "detok-lc"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["detok-cased", "detok-lc", "chrF2", "chrF2++", "TER", "reported"]
    assert "[detok-lc]" in lines[2] and "case:lc" in lines[2]


def test_tokenized_flavours_score_chrf_on_unescaped_text(tmp_path):
    """Moses-tokenized text carries XML escapes (&quot;, &apos;): chrF of a tok flavour reads
    the characters they stand for, as it reads the detokenized text's."""
    hyp = ['he said &quot; yes &quot; .', 'it &apos;s late .']
    ref = ['he said &quot; no &quot; .', 'it &apos;s late .']
    plain = [line.replace("&quot;", '"').replace("&apos;", "'") for line in (hyp + ref)]
    for name, lines in (("hyp.tok", hyp), ("ref.tok", ref), ("hyp", plain[:2]), ("ref", plain[2:])):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    results = bleu.score(str(tmp_path / "hyp"), str(tmp_path / "ref"), str(tmp_path / "hyp.tok"),
                         str(tmp_path / "ref.tok"))
    tok = bleu.more_metrics(results, "tok-cased")
    expected = sacrebleu_cli(tmp_path / "hyp", tmp_path / "ref")
    assert tok["chrF2"]["score"] == pytest.approx(expected[0]["score"], abs=0.006)
