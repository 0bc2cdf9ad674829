"""End to end, as a user runs it: prepare a tiny corpus with a recipe, train a few updates
of `--arch multilayer_transformer_iwslt --user-dir fairseq_ext`, translate and score with
scripts/evaluate.sh, and compare two outputs with scripts/significance.sh. Everything is
written under tmp_path.
"""
import json
import random
import subprocess
import sys

import pytest

from script_utils import REPO, SCRIPTS, run

ARCH = "multilayer_transformer_iwslt"

pytestmark = pytest.mark.slow


def arch_registered():
    """The architecture comes from fairseq_ext; skip (not fail) only while it is missing."""
    code = ("import sys; sys.path.insert(0, %r); import fairseq_ext; "
            "from fairseq.models import ARCH_MODEL_REGISTRY as R; "
            "sys.exit(0 if %r in R else 3)" % (str(REPO), ARCH))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return res.returncode == 0, res.stderr[-2000:]


def synthetic_corpus(root, n_train=401, n_eval=41):
    """A toy 'translation' task (word-by-word cipher of English), Multi30k file layout."""
    words = ("a man woman dog cat child runs sits plays on the in street park red blue "
             "big small ball water house tree with looks at").split()
    rng = random.Random(0)
    lex = {w: "".join(rng.choice("aeioubdgklmnprstvz") for _ in range(rng.randint(3, 7)))
           for w in words}

    def pairs(n, seed):
        r = random.Random(seed)
        en, de = [], []
        for _ in range(n):
            s = [r.choice(words) for _ in range(r.randint(3, 9))]
            en.append(" ".join(s).capitalize() + ".")
            de.append(" ".join(lex[w] for w in s).capitalize() + ".")
        return en, de

    root.mkdir(parents=True)
    for split, n, seed in (("train", n_train, 1), ("val", n_eval, 2), ("test_2016_flickr", n_eval, 3)):
        en, de = pairs(n, seed)
        (root / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
        (root / f"{split}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    return root


def test_prepare_train_generate_score(tmp_path):
    ok, err = arch_registered()
    if not ok:
        pytest.skip(f"--arch {ARCH} is not registered by fairseq_ext yet: {err.strip()[-300:]}")

    corpus = synthetic_corpus(tmp_path / "corpus")
    data = tmp_path / "data-bin"
    res = run([SCRIPTS / "prepare-multi30k.sh", "--from", corpus, "--out", data,
               "--bpe-merges", "100", "--workers", "1"])
    assert res.returncode == 0, res.stderr

    ckpts = tmp_path / "ckpt"
    res = run(["fairseq-train", data, "--user-dir", REPO / "fairseq_ext", "--arch", ARCH,
               "--encoder-layers", "2", "--decoder-layers", "2",
               "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
               "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
               "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
               "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
               "--lr", "0.005", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--max-tokens", "1024", "--max-update", "30", "--save-dir", ckpts,
               "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "10",
               "--num-workers", "0", "--seed", "1", "--cpu"], cwd=tmp_path)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    ckpt = ckpts / "checkpoint_last.pt"
    assert ckpt.is_file()

    evals = {}
    for name, beam in (("beam4", "4"), ("greedy", "1")):
        out = tmp_path / f"eval-{name}"
        res = run([SCRIPTS / "evaluate.sh", "--checkpoint", ckpt, "--data", data,
                   "--split", "test", "--out", out, "--beam", beam, "--cpu",
                   "--max-len-b", "20"], cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        # one BLEU line per flavour, with its sacreBLEU signature, then the reported one
        assert "BLEU|nrefs:1|case:mixed|eff:no|tok:13a" in res.stdout
        assert "case:lc" in res.stdout and "tok:none" in res.stdout
        assert "reported BLEU [detok-cased]" in res.stdout
        for f in ("hyp.tok", "hyp.detok", "ref.tok", "ref.detok", "generate-test.txt", "bleu.json"):
            assert (out / f).is_file(), f
        assert len((out / "hyp.detok").read_text().splitlines()) == 41  # not a multiple of 8: none dropped
        # references are the recipe's text files, not fairseq's <unk>-ridden target lines
        assert (out / "ref.detok").read_text() == (data / "text" / "test.raw.de").read_text()
        scores = json.loads((out / "bleu.json").read_text())
        assert 0.0 <= scores["detok-cased"]["score"] <= 100.0
        evals[name] = out

    res = run([SCRIPTS / "significance.sh", "--eval-a", evals["greedy"], "--eval-b", evals["beam4"],
               "--names", "greedy beam4", "--samples", "100", "--out", tmp_path / "sig"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "sacreBLEU paired bootstrap, 100 samples" in res.stdout
    sig = json.loads((tmp_path / "sig" / "significance.json").read_text())
    assert sig["beam4"]["bleu"] == json.loads((evals["beam4"] / "bleu.json").read_text())["tok-cased"]["score"]


def test_evaluate_rejects_missing_checkpoint(tmp_path):
    res = run([SCRIPTS / "evaluate.sh", "--checkpoint", tmp_path / "none.pt", "--data", tmp_path])
    assert res.returncode != 0 and "checkpoint not found" in res.stderr
