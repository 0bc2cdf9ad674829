"""The figures and tables of length_buckets, attention_stats and attention_maps: counts and
notes recomputed by hand, the attention distance against a plain-torch recomputation,
one colour scale per compared figure, labelled units and a width the HTML report shows
1:1; and every analysis' figure as a paper's reader needs it: units and an axis from 0 (DC
divergence), titles, captions and the table's significance marks (layer masking, decoders),
95% Wilson intervals recomputed by hand (probing), a legend over no line (translating from a
layer), one colour per model in every figure, and a stored table read back to draw it again
(no model needed; the trained-model checks are in test_analysis_maps.py)."""
import json
import os
import struct

import pytest
import torch

from fairseq_ext.analysis import AnalysisError, attention_maps, attention_stats, capture, figures, length_buckets

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_MAGIC
    return struct.unpack(">II", head[16:24])


def texts(fig):
    """Every text drawn in ``fig`` (captions unwrapped)."""
    found = [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.texts]
    return [" ".join(t.split()) for t in found]


# ---- BLEU by source length ----------------------------------------------------------------------------

# 13 sentences: lengths 3, 4, 5 (<10: 3 sentences), 12 x 7 (10-20: 7), 23 (20-30: 1), 57, 61 (>=50: 2)
LENGTHS = [3, 12, 4, 12, 23, 12, 5, 12, 57, 12, 12, 61, 12]


def tiny_eval_set():
    sources = [" ".join(f"s{k}" for k in range(n)) for n in LENGTHS]
    refs = [f"the {i} cat sat on the mat near number {i}" for i in range(len(LENGTHS))]
    good = [r if i % 3 else r.replace("mat", "rug") for i, r in enumerate(refs)]
    poor = [" ".join(r.split()[:5]) for r in refs]
    return sources, refs, {"good": good, "poor": poor}


def test_bucket_counts_and_notes_equal_a_direct_recount():
    from sacrebleu.metrics import BLEU

    sources, refs, systems = tiny_eval_set()
    rows = length_buckets.bucket_bleu([len(s.split()) for s in sources], refs, systems, "detok-cased", min_sentences=5)
    edges = [10, 20, 30, 40, 50]
    expected = [sum(1 for n in LENGTHS if lo <= n < hi) for lo, hi in zip([0] + edges, edges + [10 ** 9])]
    assert expected == [3, 7, 1, 0, 0, 2]
    assert [r["sentences"] for r in rows] == expected
    assert [r["note"] for r in rows] == ["fewer than 5 sentences", None, "fewer than 5 sentences", "0 sentences",
                                         "0 sentences", "fewer than 5 sentences"]
    assert rows[3]["good"] is None and rows[3]["poor"] is None
    idx = [i for i, n in enumerate(LENGTHS) if n >= 50]
    for name, hyps in systems.items():
        bleu = BLEU().corpus_score([hyps[i] for i in idx], [[refs[i] for i in idx]]).score
        assert rows[5][name] == pytest.approx(round(bleu, 2))
    # the default threshold: every bucket of this set is under 30
    assert all(r["note"] for r in length_buckets.bucket_bleu([len(s.split()) for s in sources], refs, systems, "detok-cased"))
    with pytest.raises(AnalysisError, match="names a column"):
        length_buckets.bucket_bleu([len(s.split()) for s in sources], refs, {"note": refs}, "detok-cased")


def test_bucket_figure_shows_counts_units_and_flags_small_buckets(tmp_path):
    sources, refs, systems = tiny_eval_set()
    rows = length_buckets.bucket_bleu([len(s.split()) for s in sources], refs, systems, "detok-cased", min_sentences=5)
    path = tmp_path / "b.png"
    fig = length_buckets.plot(rows, list(systems), "detok-cased", str(path), 5, "tokens, BPE merged",
                              "wmt14.en-de, test")
    ax, hist = fig.axes
    assert ax.get_ylabel() == "BLEU (detok-cased)" and hist.get_xlabel() == "source length (tokens, BPE merged)"
    assert "wmt14.en-de, test" in ax.get_title()
    # every bucket's count is written on its bar, the empty ones included
    assert [t.get_text() for t in hist.texts] == [str(n) for n in [3, 7, 1, 0, 0, 2]]
    assert [t.get_text() for t in ax.texts].count("0 sentences") == 2
    # the small buckets' bars (and theirs only) are hatched, and the legend says why
    hatched = [[bool(p.get_hatch()) for p in c] for c in ax.containers]
    assert hatched == [[True, False, True, False, False, True]] * 2
    assert "fewer than 5 sentences" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("--min-bucket-sentences" in t for t in texts(fig))
    assert png_size(path)[0] <= 1100


def fake_evaluation(directory, hyps, refs, sources, remove_bpe):
    os.makedirs(directory)
    for name, lines in (("src.tok", sources), ("ref.detok", refs), ("hyp.detok", hyps)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    with open(os.path.join(directory, "bleu.json"), "w") as f:
        json.dump({"headline": "detok-cased"}, f)
    with open(os.path.join(directory, "generate-test.cmd"), "w") as f:
        f.write("fairseq-generate data-bin/x --gen-subset test " + remove_bpe + " --beam 5 \n")
    with open(os.path.join(directory, ".evaluation-complete"), "w") as f:
        f.write("checkpoint=x.pt\ndata=/somewhere/data-bin/iwslt14.de-en\nsplit=test\n")


def test_length_buckets_command_writes_counts_notes_and_the_reading(tmp_path):
    sources, refs, systems = tiny_eval_set()
    for name, hyps in systems.items():
        fake_evaluation(str(tmp_path / name), hyps, refs, sources, "--remove-bpe")
    length_buckets.main(["--eval", str(tmp_path / "good"), str(tmp_path / "poor"), "--names", "A", "B", "--out",
                         str(tmp_path / "out"), "--min-bucket-sentences", "3", "--length-unit", "word"])
    rows = json.loads((tmp_path / "out" / "buckets.json").read_text())
    assert [(r["bucket"], r["sentences"], r["note"]) for r in rows] == [
        ("<10", 3, None), ("10-20", 7, None), ("20-30", 1, "fewer than 3 sentences"), ("30-40", 0, "0 sentences"),
        ("40-50", 0, "0 sentences"), (">=50", 2, "fewer than 3 sentences")]
    title = (tmp_path / "out" / "buckets.md").read_text().splitlines()[0]
    assert title == "### BLEU (detok-cased) by source length (tokens, BPE merged): iwslt14.de-en, test"
    assert png_size(tmp_path / "out" / "buckets.png")[0] <= 1100
    with pytest.raises(AnalysisError, match="--min-bucket-sentences"):
        length_buckets.main(["--eval", str(tmp_path / "good"), "--out", str(tmp_path / "x"),
                             "--min-bucket-sentences", "0"])


def test_lengths_count_the_subword_tokens_the_model_read_as_the_papers_bucket(tmp_path):
    """The default unit: the binarized source of the evaluated split (its sizes less EOS),
    not the merged words of src.tok; a bucket a-b holds a to b-1."""
    import subprocess
    import sys

    bpe = ["wo@@ rd " * 6 + "end"] * 3 + ["a b c"] * 4 + ["x@@ y z " * 9] * 2  # 13, 3 and 27 subword tokens
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("src", "tgt"):
        (raw / f"test.{lang}").write_text("\n".join(bpe) + "\n")
    preprocess = os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess")
    subprocess.run([preprocess, "--source-lang", "src", "--target-lang", "tgt", "--trainpref", str(raw / "test"),
                    "--testpref", str(raw / "test"),
                    "--destdir", str(tmp_path / "bin"), "--workers", "1", "--joined-dictionary"], check=True,
                   capture_output=True)
    merged = [line.replace("@@ ", "") for line in bpe]
    fake_evaluation(str(tmp_path / "e"), merged, merged, merged, "--remove-bpe")
    with open(tmp_path / "e" / ".evaluation-complete", "w") as f:
        f.write(f"checkpoint=x.pt\ndata={tmp_path / 'bin'}\nsplit=test\nsrc=src\ntgt=tgt\n")
    assert length_buckets.subword_lengths(str(tmp_path / "e"), 9) == [13] * 3 + [3] * 4 + [27] * 2
    assert [len(line.split()) for line in merged] == [7] * 3 + [3] * 4 + [18] * 2
    length_buckets.main(["--eval", str(tmp_path / "e"), "--out", str(tmp_path / "out"), "--edges", "10,20,30"])
    rows = json.loads((tmp_path / "out" / "buckets.json").read_text())
    assert [(r["bucket"], r["sentences"]) for r in rows] == [("<10", 4), ("10-20", 3), ("20-30", 2), (">=30", 0)]
    assert "by source length (subword tokens)" in (tmp_path / "out" / "buckets.md").read_text().splitlines()[0]
    with pytest.raises(AnalysisError, match="--length-unit word"):
        length_buckets.subword_lengths(str(tmp_path / "e"), 8)


@pytest.mark.parametrize("remove_bpe, unit", [("--remove-bpe", "tokens, BPE merged"),
                                              ("--remove-bpe sentencepiece", "words, SentencePiece merged"),
                                              ("", "tokens")])
def test_length_unit_is_what_evaluation_merged(tmp_path, remove_bpe, unit):
    fake_evaluation(str(tmp_path / "e"), ["a"], ["a"], ["a"], remove_bpe)
    assert length_buckets.length_unit(str(tmp_path / "e")) == unit


# ---- attention distance and entropy -------------------------------------------------------------------

def random_attention(seed=3, bsz=3, heads=5, length=11):
    """Softmax attention of sentences of 11, 7 and 4 tokens, left-padded to 11."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([length, 7, 4])[:bsz]
    pad = torch.arange(length)[None, :] < (length - lengths)[:, None]
    logits = torch.randn(bsz, heads, length, length, generator=gen, dtype=torch.float64) * 2
    weights = torch.softmax(logits.masked_fill(pad[:, None, None, :], float("-inf")), -1)
    weights = weights.masked_fill(pad[:, None, :, None], 0.0)
    return weights, pad, lengths


def by_hand(weights, pad, lengths, left):
    """sum_x sum_i sum_j a_ij d(i, j) and sum a_ij per head, sentence by sentence, in float64."""
    heads = weights.size(1)
    distance, weight = torch.zeros(heads, dtype=torch.float64), torch.zeros(heads, dtype=torch.float64)
    for b, n in enumerate(lengths.tolist()):
        a = weights[b][:, pad.size(1) - n:, pad.size(1) - n:]  # H x n x n, the sentence alone
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        d = (i - j).double() if left else (i - j).abs().double()
        keep = (j <= i).double() if left else torch.ones(n, n, dtype=torch.double)
        distance += (a * d * keep).sum((1, 2))
        weight += (a * keep).sum((1, 2))
    return distance, weight


def test_attention_distance_default_is_over_all_keys():
    weights, pad, lengths = random_attention()
    got = attention_stats.head_statistics(weights.float(), pad)  # the default reading
    distance, weight = by_hand(weights, pad, lengths, left=False)
    torch.testing.assert_close(got["distance"].double(), distance, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["weight"].double(), weight, rtol=1e-5, atol=1e-5)
    # every row sums to 1 over all keys: the weight sum is the number of query tokens
    assert got["weight"].tolist() == pytest.approx([float(lengths.sum())] * 5, rel=1e-5)


def test_attention_distance_left_is_the_reading_as_printed():
    weights, pad, lengths = random_attention(seed=5)
    got = attention_stats.head_statistics(weights.float(), pad, "left")
    distance, weight = by_hand(weights, pad, lengths, left=True)
    torch.testing.assert_close(got["distance"].double(), distance, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["weight"].double(), weight, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="--span"):
        attention_stats.head_statistics(weights.float(), pad, "as-printed")


def test_a_forward_only_head_has_distance_zero_only_when_read_left():
    """A head that attends only to later keys (MMA's forward head) spans a distance over all
    keys; as printed (j <= i) it keeps only its diagonal weight, at distance 0."""
    n = 6
    pad = torch.zeros(1, n, dtype=torch.bool)
    forward = torch.triu(torch.ones(n, n))
    w = (forward / forward.sum(-1, keepdim=True))[None, None]
    mean_all = attention_stats.head_statistics(w, pad)
    mean_left = attention_stats.head_statistics(w, pad, "left")
    expected = sum(sum(j - i for j in range(i, n)) / (n - i) for i in range(n)) / n
    assert (mean_all["distance"] / mean_all["weight"]).item() == pytest.approx(expected)
    assert mean_left["distance"].item() == 0.0


def stats_rows(name, span="all", types=None):
    totals = {"global": {0: {"distance": torch.tensor([1.0, 2.0, 3.0, 4.0]), "weight": torch.ones(4),
                             "entropy": torch.tensor([0.5, 1.0, 1.5, 2.0]), "tokens": torch.ones(4)},
                         1: {"distance": torch.tensor([2.0, 3.0, 5.0, 7.0]), "weight": torch.ones(4),
                             "entropy": torch.tensor([0.2, 0.4, 0.6, 0.8]), "tokens": torch.ones(4)}}}
    scale = 1.0 if name == "a" else 2.0
    for s in totals["global"].values():
        s["distance"] = s["distance"] * scale
    return attention_stats.summarise(name, totals, span, types)


def test_attention_stats_figures_name_the_reading_and_share_one_scale(tmp_path):
    mma = {0: ["G", "L", "F", "B"], 1: ["G", "L", "F", "B"]}
    rows = stats_rows("a", "all", mma) + stats_rows("b", "all")
    assert {r["span"] for r in rows} == {"all"} and [r["type"] for r in rows[:4]] == ["G", "L", "F", "B"]
    assert rows[-1]["type"] is None
    fig = attention_stats.heatmaps(rows, "a", str(tmp_path / "a.png"), "bin, valid (13 sentences)")
    images = [ax.images[0] for ax in fig.axes if ax.images]
    # distance on one scale for both models (b's distances are twice a's), entropy on another
    assert images[0].get_clim() == (1.0, 14.0) and images[1].get_clim() == pytest.approx((0.2, 2.0))
    other = attention_stats.heatmaps(rows, "b", str(tmp_path / "b.png"))
    assert [ax.images[0].get_clim() for ax in other.axes if ax.images] == [im.get_clim() for im in images]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1\nG", "2\nL", "3\nF", "4\nB"]
    assert [t.get_text() for t in other.axes[0].get_xticklabels()] == ["1", "2", "3", "4"]
    assert not any("MMA head types" in t for t in texts(other))  # b has no MMA heads to explain
    bars = [a.get_ylabel() for a in fig.axes if not a.images]
    assert bars == ["tokens", "nats"]
    caption = " ".join(texts(fig))
    assert "over all keys j, d = |i - j|" in caption and "--span all" in caption and "F = forward" in caption
    assert "a: encoder self-attention per head, bin, valid (13 sentences)" in texts(fig)
    layers = attention_stats.layer_plot(attention_stats.per_layer(rows), str(tmp_path / "l.png"))
    assert [a.get_ylabel() for a in layers.axes] == ["mean attention distance (tokens)",
                                                     "mean attention entropy (nats)"]
    assert "--span all" in " ".join(texts(layers))
    left = attention_stats.layer_plot(attention_stats.per_layer(stats_rows("a", "left")), str(tmp_path / "m.png"))
    assert "over the keys j <= i, d = i - j (as printed)" in " ".join(texts(left))
    for png in ("a.png", "b.png", "l.png"):
        assert png_size(tmp_path / png)[0] <= 1100
    with pytest.raises(AnalysisError, match="several spans"):
        attention_stats.layer_plot(attention_stats.per_layer(rows + stats_rows("c", "left")), str(tmp_path / "x.png"))


# ---- attention maps: layout and colour scale ----------------------------------------------------------

def panels(count, tokens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = [f"tok{k}" for k in range(tokens)]
    return [figures.Panel(f"h{h + 1}", torch.softmax(torch.randn(tokens, tokens, generator=gen), -1).numpy(),
                                 labels, labels) for h in range(count)]


@pytest.mark.parametrize("count, tokens, cols", [(8, 13, 4), (8, 19, 3), (8, 29, 2), (8, 32, 2), (4, 17, 2),
                                                 (3, 45, 1)])
def test_grid_keeps_token_labels_legible_at_the_reports_width(count, tokens, cols):
    layout = figures.grid_layout(panels(count, tokens))
    assert layout["cols"] == cols and layout["rows"] == -(-count // cols)
    assert layout["font"] >= figures.MIN_FONT_SIZE
    # the cells hold the labels: at least 1.2 times their size apart
    assert layout["cell"] >= 1.2 * layout["font"] - 1e-9 or layout["font"] == figures.MIN_FONT_SIZE


def test_map_figure_draws_one_colour_scale_with_a_colour_bar(tmp_path):
    drawn = panels(7, 21)
    fig = figures.map_figure(drawn, "M: encoder self-attention, layer 1 (bin, test)", "caption text",
                                    vmax=1.0, xlabel="key token j", ylabel="query token i")
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 7 and {im.get_clim() for im in images} == {(0.0, 1.0)}
    bars = [ax for ax in fig.axes if not ax.images]
    assert len(bars) == 1 and bars[0].get_ylabel().startswith("attention weight")
    assert all(t.get_fontsize() >= figures.MIN_FONT_SIZE for ax in fig.axes[:7] for t in ax.get_xticklabels())
    # y token labels on the first panel of each row only, x labels on every panel
    assert [any(t.get_text() for t in ax.get_yticklabels()) for ax in fig.axes[:7]] == [
        True, False, False, True, False, False, True]
    assert all(any(t.get_text() for t in ax.get_xticklabels()) for ax in fig.axes[:7])
    assert fig.get_figwidth() <= figures.FIGURE_WIDTH
    figures.save_figure(fig, str(tmp_path / "m.png"))
    assert png_size(tmp_path / "m.png")[0] <= 1100
    top = max(float(p.matrix.max()) for p in drawn)
    assert attention_maps.scale_of([p.matrix for p in drawn], "max") == pytest.approx(top)
    assert attention_maps.scale_of([p.matrix for p in drawn], "unit") == 1.0


def test_mma_legend_and_the_display_name():
    assert capture.mma_legend(["G", "F", "G"], 1) == (
        "MMA head types (the model's --mma-heads): G = global (every key); F = forward (keys j >= i).")
    assert "L = local (|i - j| <= 2)" in capture.mma_legend(["L"], 2)
    assert capture.mma_legend([]) == ""
    assert attention_maps.display_name("runs/mma/checkpoint_best.pt") == "mma"
    assert attention_maps.display_name("runs/mma/checkpoint17.pt") == "mma"
    assert attention_maps.display_name("models/mma-big.pt") == "mma-big"
    assert attention_maps.display_name("runs/mma/checkpoint_best.pt", "MMA (ours)") == "MMA (ours)"
    assert figures.file_stem("MMA (ours)") == "MMA_ours"
    with pytest.raises(AnalysisError, match="--names: 2 names"):
        attention_maps.display_name("x.pt", ["a", "b"])


def test_cut_note_says_what_max_tokens_left_out():
    assert attention_maps.cut_note(45, 51, 32) == (" Only the first 32 of the 45 source tokens and 51 target tokens "
                                                   "are drawn (--max-tokens 32); the rows drawn then sum to less "
                                                   "than 1.")
    assert attention_maps.cut_note(20, 23, 32) == ""
    # target rows cut: each row drawn still holds all its weight
    assert attention_maps.cut_note(20, 40, 32) == (" Only the first 32 of the 40 target tokens are drawn "
                                                   "(--max-tokens 32).")


def test_every_figure_says_which_models_data_and_decoding_made_it(tmp_path):
    """An analysis command's figures end their caption (or get one) with its models (size and
    updates, from each checkpoint), the data (test set and size, from prep.env), the decoding
    and the BLEU flavour: what was parsed from its command line."""
    from types import SimpleNamespace

    from fairseq import checkpoint_utils

    from fairseq_ext.analysis import layer_dependency
    from model_utils import write_checkpoint

    path = write_checkpoint(tmp_path / "m10-aif.pt", "--joint-attention", "m-10", "--aux-decoder-layers", "1",
                            "--aux-fusion")
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    cfg, updates = state["cfg"]["model"], state["optimizer_history"][-1]["num_updates"]
    data = tmp_path / "multi30k-en-de"
    data.mkdir()
    (data / "prep.env").write_text("src=en\ntgt=de\ntest_set=test_2016_flickr\ntest_pairs=1000\n")
    args = layer_dependency.build_parser().parse_args(["--checkpoint", path, "--names", "M-10", "--data", str(data),
                                                       "--out", str(tmp_path / "o"), "--generate-args", "--beam 5",
                                                       "--flavour", "detok-cased"])
    context = figures.FigureContext.of(args)
    expected = (f"Model: M-10 ({cfg.encoder_layers}+{cfg.decoder_layers} layers, d_model {cfg.encoder_embed_dim}, "
                f"FFN {cfg.encoder_ffn_embed_dim}, {cfg.encoder_attention_heads} heads, {updates:,} updates). "
                "data: multi30k-en-de, test (test_2016_flickr, 1,000 sentences). decoding: --beam 5. BLEU detok-cased.")
    assert context.note() == expected
    plt = figures.pyplot()
    for caption in ("What the figure shows.", None):
        fig, ax = plt.subplots()
        ax.plot([1, 2], [3, 4])
        if caption:
            figures.add_caption(fig, caption)
        texts = []
        fig.savefig = lambda *a, **k: texts.extend(t.get_text().replace("\n", " ") for t in fig.texts)
        figures.save_figure(fig, str(tmp_path / "f.png"), context)
        (text,) = texts
        assert text.startswith(caption or "Model: M-10") and text.endswith("BLEU detok-cased.")
        assert " ".join(expected.split()) in " ".join(text.split())
    # an analysis of part of the split says how much of it
    part = figures.FigureContext.of(SimpleNamespace(checkpoint=path, names=["M-10"], data=str(data), split="test",
                                                    max_sentences=500))
    assert "data: multi30k-en-de, test (test_2016_flickr, 500 of its 1,000 sentences)." in part.note()
    # an analysis of other text than the split (probing's tasks) names that text instead
    tasks = figures.FigureContext.of(SimpleNamespace(checkpoint=path, names=["M-10"], data=str(data), split="test"),
                                     "the probing tasks SentLen (870/84/84), reported on te")
    assert tasks.note().endswith("data: the probing tasks SentLen (870/84/84), reported on te.")


# ---- what a reader of a paper needs on every figure: units, titles, marks, intervals, colours ---------

def drawn(fig):
    """``fig`` drawn (text and legend positions are known only then)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # save_figure closed it
    canvas.draw()
    return canvas.get_renderer()


def test_dc_divergence_is_in_nats_on_an_axis_from_zero_with_title_and_caption(tmp_path):
    from fairseq_ext.analysis import dc_divergence

    rows = [{"model": "Enc-DC", "layer": l, "JS": v} for l, v in ((1, 0.103), (2, 0.092), (3, 0.151))]
    fig = dc_divergence.plot(rows, [{"model": "Enc-DC", "Ed": 0.116}], ["Enc-DC"], str(tmp_path / "dc.png"),
                             heads="mean", data="bin, test")
    layers, ed = fig.axes
    assert "nats" in layers.get_ylabel()
    assert layers.get_ylim()[0] == 0 and ed.get_ylim()[0] == 0  # the axis does not magnify the differences
    assert layers.get_ylim()[1] > 0.151
    caption = " ".join(texts(fig))
    assert "Jensen-Shannon divergence between the global and the local FI unit: bin, test" in texts(fig)
    assert "JS(α_g || α_l)" in caption and "--heads mean" in caption and "starts at 0" in caption
    assert {"0.103", "0.092", "0.151", "0.116"} <= set(texts(fig))


def masking_rows(model="M-00"):
    return [{"model": model, "masked layer": "none", "BLEU": 28.53, "delta": None, "p": None, "mark": "",
             "flavour": "detok-cased"},
            {"model": model, "masked layer": "f^1", "BLEU": 16.07, "delta": -12.46, "p": 0.0, "mark": "‡",
             "flavour": "detok-cased"},
            {"model": model, "masked layer": "f^2", "BLEU": 27.9, "delta": -0.63, "p": 0.03, "mark": "†",
             "flavour": "detok-cased"},
            {"model": model, "masked layer": "f^3", "BLEU": 28.4, "delta": -0.13, "p": 0.4, "mark": "",
             "flavour": "detok-cased"}]


def test_masking_figure_marks_each_layer_as_the_table_does(tmp_path):
    from fairseq_ext.analysis import layer_dependency

    fig = layer_dependency.plot(masking_rows(), str(tmp_path / "m.png"))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["-12.46‡", "-0.63†", "-0.13"]
    # each label at its point: the marks belong to the masked layer of the table's row
    assert [t.xy for t in ax.texts] == [(1, -12.46), (2, -0.63), (3, -0.13)]
    assert "BLEU lost with one collected encoder layer masked" in texts(fig)
    caption = " ".join(texts(fig))
    assert "‡ p < 0.01, † p < 0.05" in caption and "full: M-00 28.53" in caption
    assert ax.get_ylabel() == "ΔBLEU (detok-cased)"
    # several models: the marks alone beside the points
    two = layer_dependency.plot(masking_rows() + masking_rows("M-10"), str(tmp_path / "m2.png"), marks="mma")
    assert sorted(t.get_text() for t in two.axes[0].texts) == sorted(["‡", "†", "‡", "†"])
    assert "†† p < 0.01" in " ".join(texts(two))


def test_decoders_figure_has_a_title_a_caption_and_the_marks(tmp_path):
    from fairseq_ext.analysis import decoders

    rows = [{"model": "MS-1", "decoder": "main", "reads encoder layer": 3, "BLEU": 28.26, "delta": None, "p": None,
             "mark": "", "flavour": "detok-cased"},
            {"model": "MS-1", "decoder": "aux1", "reads encoder layer": 1, "BLEU": 27.1, "delta": -1.16, "p": 0.002,
             "mark": "‡", "flavour": "detok-cased"}]
    fig = decoders.plot(rows, str(tmp_path / "d.png"))
    assert "27.10\n-1.16‡" in [t.get_text() for t in fig.axes[0].texts]
    assert any(t.startswith("BLEU of the main and every auxiliary decoder") for t in texts(fig))
    assert "‡ p < 0.01" in " ".join(texts(fig))


def wilson_by_hand(k, n):
    z = 1.959964
    p = k / n
    centre = (p + z ** 2 / (2 * n)) / (1 + z ** 2 / n)
    half = z / (1 + z ** 2 / n) * (p * (1 - p) / n + z ** 2 / (4 * n ** 2)) ** 0.5
    return 100 * (centre - half), 100 * (centre + half)


def probing_rows():
    return [{"category": "Surface", "task": "SentLen", "labels": 6, "train": 870, "test": 84, "majority": 16.67,
             "baseline": 64.29, "MMA": 69.05},
            {"category": "Surface", "task": "WC", "labels": 100, "train": 3600, "test": 400, "majority": 1.0,
             "baseline": 15.5, "MMA": 15.5},
            {"category": "Surface", "task": "#AVG", "labels": None, "train": None, "test": None, "majority": 8.84,
             "baseline": 39.9, "MMA": 42.27}]


def test_probing_draws_95_percent_wilson_intervals_over_each_tasks_test_sentences(tmp_path):
    from fairseq_ext.analysis import probing

    columns = ["baseline", "MMA"]
    fig = probing.plot(probing_rows(), columns, {c: [(3, c)] for c in columns}, str(tmp_path / "p.png"))
    ax = fig.axes[0]
    bars = [c for c in ax.containers if hasattr(c, "errorbar")]
    assert len(bars) == 2
    for container, column in zip(bars, columns):
        segments = container.errorbar.lines[2][0].get_segments()
        correct = {"SentLen": round(0.6429 * 84) if column == "baseline" else round(0.6905 * 84), "WC": 62}
        for segment, (task, n) in zip(segments, (("SentLen", 84), ("WC", 400))):
            low, high = wilson_by_hand(correct[task], n)
            assert (segment[0][1], segment[1][1]) == (pytest.approx(low, abs=1e-6), pytest.approx(high, abs=1e-6))
    assert correct["SentLen"] == 58  # MMA: 58 of 84 sentences, 69.05%
    assert [t.get_text() for t in ax.get_xticklabels()] == ["SentLen\n(n = 84)", "WC\n(n = 400)"]
    caption = " ".join(texts(fig))
    assert "95% Wilson score intervals" in caption and "SentLen 84, WC 400" in caption


def test_translate_from_layer_legend_covers_no_line(tmp_path):
    from fairseq_ext.analysis import translate_from_layer

    rows = [{"layer": l, "BLEU-1": b1, "BLEU": b} for l, b1, b in ((0, 31.6, 5.1), (1, 36.6, 7.2), (2, 37.8, 7.7),
                                                                   (3, 37.4, 7.2))]
    rows.append({"layer": "FULL", "BLEU-1": 50.4, "BLEU": 23.6})
    fig = translate_from_layer.plot({"baseline": rows}, str(tmp_path / "t.png"))
    renderer = drawn(fig)
    legend = next(a.get_legend() for a in fig.axes if a.get_legend())
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
        full = [line for line in ax.lines if line.get_linestyle() == "--"]
        assert full, "the FULL line is drawn"
        assert not box.overlaps(ax.get_window_extent(renderer))  # beside the axes: over no line at all
        for line in full:
            points = ax.transData.transform(list(zip(*line.get_data())))
            assert not any(box.contains(x, y) for x, y in points)
    assert "Translating straight from an encoder layer, without the decoder" in texts(fig)


def test_one_model_has_one_colour_in_every_figure(tmp_path):
    from matplotlib.colors import to_rgb

    from fairseq_ext.analysis import probing, translate_from_layer, word_order

    sources, refs, _ = tiny_eval_set()
    systems = {"baseline": refs, "MMA": refs}
    rows = length_buckets.bucket_bleu([len(s.split()) for s in sources], refs, systems, "detok-cased", min_sentences=1)
    buckets = length_buckets.plot(rows, ["baseline", "MMA"], "detok-cased", str(tmp_path / "b.png"))
    bar_colour = {c.get_label(): to_rgb(c.patches[0].get_facecolor()[:3]) for c in buckets.axes[0].containers}
    # the other order, and a third model: the colours stay
    layers = attention_stats.layer_plot(attention_stats.per_layer(stats_rows("MMA") + stats_rows("M-00")
                                                                  + stats_rows("baseline")), str(tmp_path / "l.png"))
    line_colour = {l.get_label(): to_rgb(l.get_color()) for l in layers.axes[0].lines}
    columns = ["MMA", "baseline"]
    probed = probing.plot(probing_rows(), columns, {c: [(3, c)] for c in columns}, str(tmp_path / "p.png"))
    probe_colour = {c.get_label(): to_rgb(c.patches[0].get_facecolor()[:3]) for c in probed.axes[0].containers
                    if hasattr(c, "errorbar")}
    full = [{"layer": 0, "BLEU-1": 30.0, "BLEU": 5.0}, {"layer": "FULL", "BLEU-1": 50.0, "BLEU": 24.0}]
    layer_fig = translate_from_layer.plot({"MMA": full}, str(tmp_path / "t.png"))
    assert to_rgb(layer_fig.axes[0].lines[0].get_color()) == bar_colour["MMA"]
    for name in ("baseline", "MMA"):
        colour = to_rgb(figures.system_colours([name])[name])
        assert line_colour[name] == bar_colour[name] == probe_colour[name] == colour
    assert bar_colour["baseline"] != bar_colour["MMA"]
    order = word_order.plot([{"model": "MMA", "encoder positions": "sinusoidal", "BLEU": 30.1, "delta": None,
                              "mark": "", "flavour": "detok-cased"}], str(tmp_path / "w.png"))
    assert order.axes[0].patches[0].get_edgecolor()[:3] != bar_colour["MMA"]  # alone: hollow and grey
    # names as the benchmark's rows spell them are the same model
    for spelling, name in (("MS-1+AIF", "ms-1-plus-aif"), ("baseline-nopos", "baseline-no-pos")):
        assert figures.system_colours([spelling])[spelling] == figures.system_colours([name])[name]


def test_names_the_palette_does_not_know_keep_one_colour_and_differ_within_a_figure():
    names = [f"run-{k}" for k in range(12)]
    colours = figures.system_colours(names)
    assert len(set(colours.values())) == 12
    again = figures.system_colours(list(reversed(names)))
    assert again == colours  # the order a figure lists them in changes nothing


def test_a_table_kept_only_as_markdown_reads_back_as_its_rows(tmp_path):
    from fairseq_ext.analysis import command as tables

    rows = [{"model": "M-00", "masked layer": "f^1", "BLEU": 16.07, "delta": -12.46, "p": 0.0, "mark": "‡",
             "|Y|": 3, "note": None, "text": "a - b"}]
    tables.write_table(rows, str(tmp_path), "t")
    os.remove(tmp_path / "t.json")
    assert tables.read_table(str(tmp_path), "t") == rows


def test_aif_figures_are_in_nats_from_zero_with_captions(tmp_path):
    from fairseq_ext.analysis import aif_dependency

    summary = [{"model": "MS-1+AIF", "sentences": 2, "mean D_Y": 1.2, "D^1": 0.35, "D^2": 0.62, "mean D^l": 0.49}]
    per_sentence = [{"model": "MS-1+AIF", "id": i, "|Y|": 5, "D_Y": d} for i, d in enumerate((1.0, 1.4))]
    per_head = [{"model": "MS-1+AIF", "layer": l, "head": h, "D^l_h": 0.3 * l + 0.01 * h} for l in (1, 2)
                for h in (1, 2)]
    fig = aif_dependency.plot_dependency(summary, per_sentence, per_head, str(tmp_path / "a.png"))
    assert [ax.get_ylim()[0] for ax in fig.axes] == [0, 0]
    assert "KL(P_m(y_t) || P_ind(y_t))" in " ".join(texts(fig))
    tokens = [{"model": "MS-1+AIF", "sentence": 5, "source": "a b", "position": 1, "token": "Ein", "D_yt": 0.5}]
    fig = aif_dependency.plot_tokens(tokens, str(tmp_path / "t.png"))
    assert fig.axes[0].get_ylabel() == "D_yt (KL, nats)" and "Eq. 4.4" in " ".join(texts(fig))


def test_the_documentations_figures_redraw_from_the_stored_tables(tmp_path):
    """scripts/redraw_report_figures.py draws every figure of docs/figures/ that comes from a
    stored table, from that table alone."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "redraw_report_figures.py")
    spec = importlib.util.spec_from_file_location("redraw_report_figures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.redraw(str(tmp_path))
    assert len(written) == 10
    for png in written:
        assert png_size(png)[0] <= 1100  # the report's width, shown 1:1
