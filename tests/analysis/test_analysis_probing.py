"""probing (thesis Sec. 4.5.4 / 5.6.1, Tables 4.8 and 5.5; SentEval's probing tasks): the
generated SentLen / WC / BShift tasks against SentEval's rules, mean pooling against the
encoder's own layer outputs, the probe at chance on random labels and near 1 on a trivially
separable task, the frozen encoder, and the command end to end on a tiny trained model."""
import collections
import json
import random

import pytest
import torch

from fairseq_ext.common import checkpoints, data_text
from fairseq_ext.analysis import AnalysisError, capture, probing
from model_utils import make_tiny_parallel_data, train_tiny

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WORDS = [f"w{i}" for i in range(24)]  # the tiny model's vocabulary


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("probing")
    bin_dir = make_tiny_parallel_data(str(root), num_train=121)
    ckpt = train_tiny(bin_dir, root / "std")
    model, task = checkpoints.load_model(ckpt, bin_dir, cpu=True)
    pipeline = data_text.TextPipeline(bin_dir, task.source_dictionary, model.encoder.max_positions())
    return {"root": root, "bin": bin_dir, "ckpt": ckpt, "model": model, "pipeline": pipeline}


def sentences(rng, n, lengths):
    return [" ".join(rng.choice(WORDS) for _ in range(rng.choice(lengths))) for _ in range(n)]


# ---- the generated tasks follow SentEval's rules -------------------------------------------

def synthetic_corpus(seed=0, n=1500):
    """Tokenized sentences of 4-30 tokens: a few very frequent short words, mid-frequency
    words of 4+ characters, some punctuation and double quotes."""
    rng = random.Random(seed)
    frequent = ["the", "a", "of", "and", "to"]
    mid = [f"word{c}{c}" for c in "abcdefghijkl"]
    rare = [f"rare{i:03d}" for i in range(300)]
    out = []
    for _ in range(n):
        toks = []
        for _ in range(rng.randint(4, 30)):
            r = rng.random()
            toks.append(rng.choice(frequent) if r < 0.5 else rng.choice(rare) if r < 0.9 else rng.choice(mid))
        if rng.random() < 0.3:
            toks.insert(rng.randint(1, len(toks)), rng.choice([",", ".", ";"]))
        if rng.random() < 0.05:
            toks.insert(0, '"')
        out.append(toks)
    return out


def test_generated_tasks_follow_senteval_rules():
    corpus = synthetic_corpus()
    tasks = probing.generate_tasks(corpus, ["SentLen", "WC", "BShift"], sizes=(80, 10, 10), seed=1, wc_words=6,
                                   wc_rank_start=3, min_per_class=3)
    corpus_set = {" ".join(t) for t in corpus}
    for name, data in tasks.items():
        seen = [s for p in probing.PARTITIONS for _, s in data[p]]
        assert len(seen) == len(set(seen)), name  # no sentence twice (so never in two partitions)
        tr_counts = collections.Counter(label for label, _ in data["tr"])
        assert len(set(tr_counts.values())) == 1, (name, tr_counts)  # balanced over the labels
        assert all(data[p] for p in probing.PARTITIONS)

    # SentLen: SentEval's bins 0: 5-8, 1: 9-12, 2: 13-16, 3: 17-20, 4: 21-25, 5: 26-28
    bins = {0: (5, 8), 1: (9, 12), 2: (13, 16), 3: (17, 20), 4: (21, 25), 5: (26, 28)}
    sentlen = tasks["SentLen"]
    assert {label for label, _ in sentlen["tr"]} == {"0", "1", "2", "3", "4", "5"}
    for p in probing.PARTITIONS:
        for label, s in sentlen[p]:
            lo, hi = bins[int(label)]
            assert lo <= len(s.split()) <= hi and s in corpus_set

    # WC: the target words are the 4+-character words from frequency rank 4 on; each sentence
    # holds exactly one target word, exactly once, and that word is its label
    unique = list(dict.fromkeys(tuple(t) for t in corpus))
    freq = collections.Counter(t.lower() for s in unique for t in s)
    ranked = sorted(freq, key=lambda w: -freq[w])
    assert set(ranked[:3]) <= {"the", "a", "of", "and", "to"}
    targets = [w for w in ranked[3:] if len(w) >= 4][:6]
    assert set(targets) == {f"word{c}{c}" for c in "abcdefghijkl"} & set(targets) and len(targets) == 6
    wc = tasks["WC"]
    assert {label for label, _ in wc["tr"]} <= set(targets)
    for p in probing.PARTITIONS:
        for label, s in wc[p]:
            toks = [t.lower() for t in s.split()]
            assert toks.count(label) == 1 and sum(toks.count(w) for w in targets) == 1 and s in corpus_set

    # BShift: I = two adjacent tokens of a corpus sentence swapped (never the first token, no
    # punctuation, never two equal tokens); O = a corpus sentence as it is; no double quotes
    bshift = tasks["BShift"]
    assert set(tr_label for tr_label, _ in bshift["tr"]) == {"I", "O"}
    for p in probing.PARTITIONS:
        for label, s in bshift[p]:
            toks = s.split()
            assert '"' not in toks
            if label == "O":
                assert s in corpus_set
                continue
            swaps = [i for i in range(1, len(toks) - 1)
                     if " ".join(toks[:i] + [toks[i + 1], toks[i]] + toks[i + 2:]) in corpus_set]
            assert swaps, s
            i = swaps[0]
            assert toks[i] != toks[i + 1]
            assert not probing.is_punctuation(toks[i]) and not probing.is_punctuation(toks[i + 1])


def test_senteval_file_round_trip_and_errors(tmp_path):
    data = {"tr": [("PAST", "he went ."), ("PRES", "he goes .")], "va": [("PAST", "she ran .")],
            "te": [("PRES", "she runs .")]}
    path = str(tmp_path / "past_present.txt")
    probing.write_senteval(data, path)
    assert open(path).read().splitlines()[0] == "tr\tPAST\the went ."
    assert probing.read_senteval(path) == data
    (tmp_path / "bad.txt").write_text("tr\tA\tx y\nte\tB\tz\n")
    with pytest.raises(AnalysisError, match="no 'va' sentences"):  # the probe early-stops on va
        probing.read_senteval(str(tmp_path / "bad.txt"))
    (tmp_path / "bad2.txt").write_text("train\tA\tx y\n")
    with pytest.raises(AnalysisError, match="bad2.txt:1"):
        probing.read_senteval(str(tmp_path / "bad2.txt"))


# ---- the representation: mean pooling of the frozen encoder ---------------------------------

def test_mean_pooling_over_non_pad_positions(tiny):
    model, pipeline = tiny["model"], tiny["pipeline"]
    rng = random.Random(1)
    sents = sentences(rng, 9, range(2, 12))
    got = probing.pooled_features(model, pipeline, sents, [0, 1, 2], max_tokens=40)  # several padded batches
    d = model.encoder.embed_tokens.embedding_dim
    with torch.no_grad():
        for k, s in enumerate(sents):
            ids = pipeline(s)
            assert ids.tolist() == [pipeline.dictionary.index(w) for w in s.split()] + [pipeline.dictionary.eos()]
            out = model.encoder(ids[None], src_lengths=torch.tensor([ids.numel()]), return_all_hiddens=True)
            states = out["encoder_states"]  # the sentence alone: no padding; post-norm: no final LayerNorm
            assert len(states) == 3
            torch.testing.assert_close(states[-1], out["encoder_out"][0])
            for l in range(3):
                # mean over every source token and the end-of-sentence token
                expected = states[l][:, 0].sum(0) / ids.numel()
                assert got[l].shape == (len(sents), d)
                torch.testing.assert_close(got[l][k], expected, atol=1e-5, rtol=1e-5)


def test_probe_at_chance_for_random_labels_and_near_one_for_sentence_length(tiny):
    model, pipeline = tiny["model"], tiny["pipeline"]
    rng = random.Random(2)
    # two length classes far apart: 5-6 tokens (S) and 18-20 tokens (L)
    split = {p: [(c, s) for c, lengths in (("S", (5, 6)), ("L", (18, 19, 20))) for s in sentences(rng, n, lengths)]
             for p, n in (("tr", 150), ("va", 40), ("te", 100))}
    for p in split:
        rng.shuffle(split[p])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    feats = {p: probing.pooled_features(model, pipeline, [s for _, s in split[p]], [2])[2] for p in split}
    assert not any(f.requires_grad for f in feats.values())
    train_args = dict(hidden=50, lr=1e-2, batch_size=64, max_epochs=40, seed=1)
    length = probing.probe_task(feats, split, **train_args)
    assert length["labels"] == 2 and length["majority"] == pytest.approx(0.5)
    assert length["accuracy"] >= 0.95
    # the same sentences with labels drawn at random: nothing to learn
    random_labels = {p: [(rng.choice("AB"), s) for _, s in split[p]] for p in split}
    chance = probing.probe_task(feats, random_labels, **train_args)
    assert 0.35 <= chance["accuracy"] <= 0.65
    # the encoder is frozen: the probes trained, the model did not change
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_probe_keeps_the_best_validation_epoch():
    torch.manual_seed(0)
    x = torch.randn(200, 8)
    y = (x[:, 0] > 0).long()
    probe, info = probing.train_probe(x[:120], y[:120], x[120:160], y[120:160], 2, hidden=0, lr=1e-2,
                                      batch_size=32, max_epochs=15, patience=3)
    assert probing.accuracy(probe, x[120:160], y[120:160]) == pytest.approx(info["valid"])
    assert info["epochs"] <= 15 and 1 <= info["best_epoch"] <= info["epochs"]
    # L2 on the hidden layer only (SentEval's MLP: Linear, dropout, sigmoid, Linear)
    mlp = probing.mlp_probe(8, 3, hidden=5)
    assert [type(m).__name__ for m in mlp] == ["Linear", "Dropout", "Sigmoid", "Linear"]


# ---- the command --------------------------------------------------------------------------

@pytest.mark.slow
def test_probing_command_writes_tables_tasks_and_figure(tiny, tmp_path):
    rng = random.Random(3)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(s + " .\n" for s in sentences(rng, 400, (5, 6, 7, 10, 11, 14, 15, 18))))
    # a task given in SentEval's format (WC over the tiny vocabulary)
    wc = {p: [(w, " ".join([w] + [rng.choice(WORDS[3:]) for _ in range(5)])) for w in ("w0", "w1", "w2")
              for _ in range(n)] for p, n in (("tr", 30), ("va", 5), ("te", 10))}
    probing.write_senteval(wc, str(tmp_path / "word_content.txt"))
    out = tmp_path / "out"
    probing.main(["--checkpoint", tiny["ckpt"], "--names", "tiny", "--data", tiny["bin"], "--out", str(out), "--cpu",
                  "--corpus", str(corpus), "--generate", "SentLen", "BShift", "--sizes", "200", "20", "20",
                  "--task", f"WC={tmp_path / 'word_content.txt'}", "--layer", "0", "-1", "--max-epoch", "5",
                  "--min-per-class", "5"])
    rows = json.loads((out / "probing.json").read_text())
    assert [(r["category"], r["task"]) for r in rows] == [("Surface", "SentLen"), ("Surface", "WC"),
                                                          ("Surface", "#AVG"), ("Syntactic", "BShift")]
    for r in rows:
        assert 0 <= r["tiny L0"] <= 100 and 0 <= r["tiny L2"] <= 100
    assert rows[1]["labels"] == 3 and rows[1]["train"] == 90 and rows[1]["test"] == 30
    assert rows[1]["majority"] == pytest.approx(100 / 3, abs=0.01)
    assert rows[2]["tiny L2"] == round((rows[0]["tiny L2"] + rows[1]["tiny L2"]) / 2, 2)
    for ext in ("md", "csv"):
        assert (out / f"probing.{ext}").exists()
    assert (out / "probing.png").read_bytes()[:8] == PNG_MAGIC
    # the generated tasks are written in SentEval's format and read back the same
    for filename, name in (("sentence_length.txt", "SentLen"), ("bigram_shift.txt", "BShift")):
        data = probing.read_senteval(str(out / "tasks" / filename))
        assert sum(len(v) for v in data.values()) == [r for r in rows if r["task"] == name][0]["train"] + \
            len(data["va"]) + len(data["te"])
    assert not (out / "tasks" / "word_content.txt").exists()


def test_pre_norm_layers_go_through_the_final_layer_norm():
    """In a pre-norm encoder every layer is read as the top one is handed on (final LayerNorm),
    so the top layer is the encoder's output."""
    from model_utils import SMALL, build, random_batch

    model, _ = build("multilayer_transformer_iwslt", *SMALL, "--encoder-normalize-before")
    src, lengths, _ = random_batch(model.encoder.dictionary)
    with torch.no_grad():
        out = model.encoder(src, src_lengths=lengths, return_all_hiddens=True)
        states = capture.layer_outputs(model.encoder, out)
    assert model.encoder.layer_norm is not None and len(states) == len(model.encoder.layers) + 1
    torch.testing.assert_close(states[-1], out["encoder_out"][0])
    torch.testing.assert_close(states[1], model.encoder.layer_norm(out["encoder_states"][1]))
