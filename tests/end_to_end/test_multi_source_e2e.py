"""Multi-source translation end to end: prepare-multi30k.sh --extra-src (one BPE, one
dictionary, every source aligned with the target), the task's adversarial --shuffle-source,
evaluate.sh on a multi-source checkpoint, and (slow) scripts/reproduce.sh ms-1 at a tiny
budget with its adversarial column."""
import gzip
import json
import os
import re
import shutil

import pytest

from model_utils import MULTI30K, REPO
from script_utils import run

SCRIPTS = os.path.join(REPO, "scripts")
needs_data = pytest.mark.skipif(not os.path.exists(os.path.join(MULTI30K, "train.en.gz")), reason="no Multi30k")


@pytest.fixture(scope="module")
def three_sources(tmp_path_factory):
    out = tmp_path_factory.mktemp("ms") / "en+fr+de-cs"
    res = run(["bash", os.path.join(SCRIPTS, "prepare-multi30k.sh"), "--src", "en", "--extra-src", "fr,de", "--tgt",
               "cs", "--from", MULTI30K, "--max-lines", "203", "--bpe-merges", "400", "--workers", "1", "--out", out])
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@needs_data
def test_recipe_binarizes_every_source_against_the_target_with_one_dictionary(three_sources):
    out = three_sources
    env = dict(line.split("=", 1) for line in (out / "prep.env").read_text().splitlines() if "=" in line and
               not line.startswith("#"))
    assert (env["src"], env["tgt"], env["extra_src"], env["train_pairs"]) == ("en", "cs", "fr,de", "203")
    dicts = {lang: (out / f"dict.{lang}.txt").read_text() for lang in ("en", "fr", "de", "cs")}
    assert len(set(dicts.values())) == 1  # one joined dictionary over all four languages
    from fairseq.data import data_utils
    from fairseq.data.dictionary import Dictionary

    d = Dictionary.load(str(out / "dict.en.txt"))
    for split, n in (("train", 203), ("valid", 1014), ("test", 1000)):
        for pair, lang in (("en-cs", "en"), ("en-cs", "cs"), ("fr-cs", "fr"), ("de-cs", "de")):
            ds = data_utils.load_indexed_dataset(str(out / f"{split}.{pair}.{lang}"), d)
            assert len(ds) == n, (split, pair, lang)
            if split == "train":  # the dictionary was built from every language's training text
                assert all(d.unk() not in ds[i] for i in range(n)), (pair, lang)
    # line k of every language is line k of the release (checked on a few lines by hand)
    for lang in ("en", "fr", "de", "cs"):
        with gzip.open(os.path.join(MULTI30K, f"test_2016_flickr.{lang}.gz"), "rt", encoding="utf-8") as f:
            release = [next(f).rstrip("\n") for _ in range(1000)]
        ours = (out / "text" / f"test.raw.{lang}").read_text(encoding="utf-8").splitlines()
        assert ours[0] == release[0] and ours[516] == release[516] and ours[-1] == release[-1]
    assert "--extra-src: language 'es' is not in Multi30k" in run(
        ["bash", os.path.join(SCRIPTS, "prepare-multi30k.sh"), "--extra-src", "es", "--out", out.parent / "x"]).stderr
    assert "--extra-src: 'cs' is already --src or --tgt" in run(
        ["bash", os.path.join(SCRIPTS, "prepare-multi30k.sh"), "--tgt", "cs", "--extra-src", "cs", "--out",
         out.parent / "y"]).stderr


def test_derangement_moves_every_sentence():
    from fairseq_ext.tasks.multi_source_translation import derangement

    for n, seed in ((2, 1), (7, 3), (1000, 1)):
        perm = derangement(n, seed)
        assert sorted(perm) == list(range(n)) and all(p != i for i, p in enumerate(perm))
    assert derangement(50, 4) == derangement(50, 4) and derangement(50, 4) != derangement(50, 5)
    with pytest.raises(ValueError, match="at least two"):
        derangement(1, 1)


@needs_data
@pytest.mark.parametrize("shuffled", ["en", "de"])
def test_shuffle_source_replaces_one_source_by_other_sentences(three_sources, shuffled):
    """The shuffled source's sentence i is the original sentence perm[i] (a derangement), the
    other sources and the target are untouched."""
    from fairseq_ext.tasks.multi_source_translation import (MultiSourceTranslationConfig,
                                                            MultiSourceTranslationTask, derangement)

    def load(shuffle):
        cfg = MultiSourceTranslationConfig(data=str(three_sources), source_lang="en", target_lang="cs",
                                           extra_source_langs="fr,de", shuffle_source=shuffle, shuffle_seed=7,
                                           dataset_impl=None, required_seq_len_multiple=1)
        task = MultiSourceTranslationTask.setup_task(cfg)
        task.load_dataset("test")
        return task.datasets["test"]

    plain, adv = load(""), load(shuffled)
    perm = derangement(len(plain), 7)
    k = ["en", "fr", "de"].index(shuffled)
    moved = 0
    for i in (0, 1, 17, 500, 999):
        a, p = adv[i], plain[i]
        sources_a = [a["source"], *a["extra_sources"]]
        sources_p = [p["source"], *p["extra_sources"]]
        q = plain[perm[i]]
        assert sources_a[k].tolist() == [q["source"], *q["extra_sources"]][k].tolist()
        moved += sources_a[k].tolist() != sources_p[k].tolist()
        for j in range(3):
            if j != k:
                assert sources_a[j].tolist() == sources_p[j].tolist()
        assert a["target"].tolist() == p["target"].tolist()
    assert moved >= 4
    with pytest.raises(ValueError, match="--shuffle-source es: not one of the sources"):
        load("es")


@pytest.fixture(scope="module")
def serial_checkpoint(three_sources):
    """A tiny serial model over en + fr + de -> cs, trained for 120 updates (after fewer, it
    says the same for every sentence)."""
    save = three_sources.parent / "ck"
    res = run(["bash", os.path.join(SCRIPTS, "train.sh"), three_sources, save, "--", "--task",
               "multi_source_translation", "-s", "en", "-t", "cs", "--extra-source-langs", "fr,de",
               "--arch", "multilayer_transformer", "--joint-attention", "serial", "--encoder-layers", "1",
               "--decoder-layers", "1", "--encoder-embed-dim", "24", "--decoder-embed-dim", "24",
               "--encoder-ffn-embed-dim", "40", "--decoder-ffn-embed-dim", "40", "--encoder-attention-heads", "2",
               "--decoder-attention-heads", "2", "--share-all-embeddings", "--optimizer", "adam", "--lr", "5e-3",
               "--max-tokens", "700", "--max-update", "120", "--criterion", "cross_entropy", "--cpu",
               "--no-epoch-checkpoints", "--no-progress-bar", "--log-format", "simple", "--seed", "1",
               "--num-workers", "0", "--disable-validation"])
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    return save / "checkpoint_last.pt"


@needs_data
def test_evaluate_and_adversarial_evaluation_of_a_multi_source_checkpoint(three_sources, serial_checkpoint):
    """evaluate.sh takes the task from prep.env; --shuffle-source changes the translations,
    keeps the references, and reports the drop against the plain evaluation."""
    common = ["--checkpoint", serial_checkpoint, "--data", three_sources, "--beam", "1", "--max-len-b", "12",
              "--batch-size", "250", "--cpu"]
    plain = serial_checkpoint.parent / "eval-test_2016_flickr"  # the default: named after the test set
    res = run(["bash", os.path.join(SCRIPTS, "evaluate.sh"), *common])
    assert res.returncode == 0, res.stderr[-3000:]
    cmd = (plain / "generate-test.cmd").read_text()
    assert "--task multi_source_translation --extra-source-langs fr\\,de --remove-bpe" in cmd  # printf %q
    plain_bleu = json.loads((plain / "bleu.json").read_text())
    assert (plain / "ref.detok").read_text() == (three_sources / "text" / "test.raw.cs").read_text()
    # chrF, chrF++ and TER beside BLEU, on the reported flavour's text (here detokenized, cased)
    from sacrebleu.metrics import CHRF, TER

    metrics = json.loads((plain / "metrics.json").read_text())
    assert plain_bleu["headline"] == "detok-cased" and list(metrics) == ["chrF2", "chrF2++", "TER"]
    hyps, refs = (plain / "hyp.detok").read_text().splitlines(), (plain / "ref.detok").read_text().splitlines()
    assert metrics["chrF2"]["score"] == round(CHRF().corpus_score(hyps, [refs]).score, 2)
    assert metrics["TER"]["score"] == round(TER(case_sensitive=True).corpus_score(hyps, [refs]).score, 2)
    text = (plain / "bleu.txt").read_text().splitlines()
    assert [line.split()[0] for line in text[-4:]] == ["chrF2", "chrF2++", "TER", "reported"]

    hyps = {}
    for lang in ("en", "de"):
        res = run(["bash", os.path.join(SCRIPTS, "evaluate.sh"), *common, "--shuffle-source", lang])
        assert res.returncode == 0, res.stderr[-3000:]
        out = serial_checkpoint.parent / f"eval-test_2016_flickr-shuffle-{lang}"  # the plain evaluation is kept
        assert (out / "ref.detok").read_text() == (plain / "ref.detok").read_text()
        if lang != "en":  # fairseq-generate prints the primary source
            assert (out / "src.tok").read_text() == (plain / "src.tok").read_text()
        hyps[lang] = (out / "hyp.tok").read_text().splitlines()
        adv = json.loads((out / "adversarial.json").read_text())
        bleu = json.loads((out / "bleu.json").read_text())["detok-cased"]["score"]
        assert (adv["shuffle_source"], adv["shuffle_seed"], adv["bleu"]) == (lang, 1, bleu)
        assert adv["unshuffled_bleu"] == plain_bleu["detok-cased"]["score"]
        assert adv["drop"] == round(adv["unshuffled_bleu"] - bleu, 2)
        assert f"{lang} shuffled, seed 1]" in res.stdout and "drop" in res.stdout
        assert "shuffle_source=" + lang in (out / ".evaluation-complete").read_text()
    plain_hyps = (plain / "hyp.tok").read_text().splitlines()
    for lang in ("en", "de"):  # either source matters to the serial model
        assert len(hyps[lang]) == len(plain_hyps) == 1000
        assert sum(h != p for h, p in zip(hyps[lang], plain_hyps)) > 100, lang
    # the shuffled English is what fairseq-generate printed as the source: other sentences
    shuffled_src = (serial_checkpoint.parent / "eval-test_2016_flickr-shuffle-en" / "src.tok").read_text()
    shuffled_src = shuffled_src.splitlines()
    original_src = (plain / "src.tok").read_text().splitlines()
    assert sorted(shuffled_src) == sorted(original_src)
    assert sum(a == b for a, b in zip(shuffled_src, original_src)) <= 2  # only duplicate sentences stay

    res = run(["bash", os.path.join(SCRIPTS, "evaluate.sh"), "--checkpoint", serial_checkpoint, "--data",
               three_sources.parent / "nowhere", "--shuffle-source", "fr"])
    assert res.returncode != 0


@needs_data
@pytest.mark.slow
@pytest.mark.release
def test_reproduce_ms1_with_its_adversarial_column(smoke_data_root, tmp_path):
    """scripts/reproduce.sh ms-1 --smoke: the single-source baseline and serial over en+fr -> de
    (French text in place of the image), 20 updates; serial is also evaluated with the French
    source replaced by other sentences."""
    shutil.copytree(smoke_data_root, tmp_path / "data", symlinks=True)  # the single-source data, prepared
    res = run([os.path.join(SCRIPTS, "reproduce.sh"), "ms-1", "--smoke", "--budget", "20", "--rows", "serial",
               "--datasets", "multi30k-en-de", "--work-dir", tmp_path / "runs", "--data-root", tmp_path / "data",
               "--samples", "50"], cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = tmp_path / "runs" / "ms-1"
    serial = json.loads(next((runs / "serial").iterdir()).joinpath("result.json").read_text())
    assert set(serial["adversarial"]) == {"fr"} and serial["bleu"] is not None
    base = json.loads(next((runs / "baseline").iterdir()).joinpath("result.json").read_text())
    assert "adversarial" not in base and serial["params"] > base["params"]  # a second encoder
    plan = json.loads(next((runs / "serial").iterdir()).joinpath("plan.json").read_text())
    assert "--extra-source-langs" in plan["train"] and "--shuffle-source" in plan["adversarial"][0]
    assert "multi30k-en+fr-de for multi30k-en-de" in res.stdout
    # a subset (--rows, --datasets) is written beside the complete table, under its own name
    written = re.search(r"^written: (\S+\.md),", res.stdout, re.M).group(1)
    assert os.path.basename(written) == "table.smoke.20.rows-serial.datasets-multi30k-en-de.md"
    assert not (runs / "table.smoke.20.md").exists()
    table = open(written, encoding="utf-8").read()
    assert "Adversarial evaluation" in table
    drop = round(serial["bleu"] - serial["adversarial"]["fr"], 2)
    assert f"fr shuffled: {serial['adversarial']['fr']:.2f} (drop {drop:.2f})" in table
