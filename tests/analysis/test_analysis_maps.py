"""attention_maps and word_order (fairseq_ext/analysis): the captured maps against direct
computations, figures checked for their panels, on tiny trained models."""
import json
import os
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F

from fairseq_ext.common import checkpoints
from fairseq_ext.analysis import AnalysisError, attention_maps, attention_stats, capture, decoding, figures, word_order
from fairseq_ext.analysis.command import batches
from fairseq_ext.analysis.capture import capture_cross_attention
from fixed_decodings import fixed_decodings
from joint_attention_reference import attention_by_hand

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def one_sentence(ckpt, bin_dir, sentence=3):
    model, task = checkpoints.load_model(ckpt, bin_dir, split="test", cpu=True)
    sample = attention_maps.sentence_sample(task, "test", sentence, None)
    target = capture.translate(model, sample, beam=2, max_len_a=1.2, max_len_b=10)[0]
    return model, task, sample, target


def test_encoder_maps_equal_torch_multi_head_attention_on_the_layer_input(map_models):
    """A standard encoder layer's captured per-head map is torch's multi_head_attention_forward
    (need_weights=True, average_attn_weights=False) run by hand with the fairseq module's
    projections on that layer's input (taken by a hook); every row sums to 1."""
    bin_dir, ckpts = map_models
    model, task, sample, target = one_sentence(ckpts["hier"], bin_dir)
    inputs = {}
    layers = model.encoder.layers
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda m, a, k, i=i: inputs.__setitem__(i, (k.get("query", a[0] if a else None),
                                                   k.get("key_padding_mask"))), with_kwargs=True)
        for i, layer in enumerate(layers)]
    maps = attention_maps.attention_maps(model, task, sample, target)
    for h in hooks:
        h.remove()
    assert [e["kind"] for e in maps["encoder"]] == ["standard", "standard"]
    for i, layer in enumerate(layers):
        x, pad = inputs[i]
        attn = layer.self_attn
        with torch.no_grad():
            _, expected = F.multi_head_attention_forward(
                x, x, x, attn.embed_dim, attn.num_heads, in_proj_weight=None,
                in_proj_bias=torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]),
                bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0,
                out_proj_weight=attn.out_proj.weight, out_proj_bias=attn.out_proj.bias, training=False,
                key_padding_mask=pad, need_weights=True, use_separate_proj_weight=True,
                q_proj_weight=attn.q_proj.weight, k_proj_weight=attn.k_proj.weight,
                v_proj_weight=attn.v_proj.weight, average_attn_weights=False)
        got = maps["encoder"][i]["global"]  # H x T x T
        assert got.shape == (attn.num_heads, x.size(0), x.size(0))
        torch.testing.assert_close(got, expected[0].float(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(got.sum(-1), torch.ones(got.shape[:-1]))
        assert maps["encoder"][i]["titles"] == {"global": ["h1", "h2"]}


def test_hierarchical_cross_attention_on_a_padded_batch(map_models):
    """Per-source maps: rows sum to 1 over the non-pad keys and are 0 on pads; beta sums to
    1 over the sources; the combined map is sum_i beta_i * map_i (multi-source paper App. A);
    capturing leaves the model's output unchanged."""
    bin_dir, ckpts = map_models
    model, task = checkpoints.load_model(ckpts["hier"], bin_dir, split="valid", cpu=True)
    sample = next(iter(batches(task, "valid")))
    net = sample["net_input"]
    pad = net["src_tokens"].eq(task.source_dictionary.pad())
    assert pad.any()  # the batch has padding to check
    with torch.no_grad():
        plain, _ = model(**net)
        with capture_cross_attention(model) as records:
            captured, _ = model(**net)
    torch.testing.assert_close(captured, plain)
    target_rows = net["prev_output_tokens"].ne(task.target_dictionary.pad())
    for index, rec in records.items():
        assert sorted(rec["per_source"]) == [0, 1]
        for w in rec["per_source"].values():  # B x H x Z x J
            assert w.shape[:2] == (pad.size(0), 2)
            assert w.masked_select(pad[:, None, None, :]).abs().max() == 0
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        beta = rec["beta"]  # B x 1 x Z x n (the module's second level averages its heads)
        assert beta.shape == (pad.size(0), 1, net["prev_output_tokens"].size(1), 2)
        torch.testing.assert_close(beta.sum(-1), torch.ones(beta.shape[:-1]))
        combined = sum(beta[..., i, None] * rec["per_source"][i] for i in range(2))
        torch.testing.assert_close(rec["attention"], combined, atol=1e-6, rtol=1e-5)
        assert rec["attention"][target_rows[:, None, :, None].expand_as(rec["attention"])].numel() > 0


@pytest.mark.parametrize("strategy", ["m-10", "serial", "parallel", "flat", "hierarchical"])
def test_per_source_maps_of_the_stacked_strategies(strategy):
    """Untrained models (random weights): the maps over each collected layer are what each
    strategy computes; rows sum to 1 per source (flat: over all sources together, and the
    split maps add up to the flat map), padded keys get 0, and capturing changes nothing."""
    from model_utils import SMALL, build, random_batch

    model, _ = build("multilayer_transformer_iwslt", *SMALL, "--joint-attention", strategy)
    model.eval()
    dictionary = model.encoder.dictionary
    src, lengths, prev = random_batch(dictionary)
    pad = src.eq(dictionary.pad())
    with torch.no_grad():
        plain, _ = model(src, lengths, prev)
        with capture_cross_attention(model) as records:
            captured, _ = model(src, lengths, prev)
    torch.testing.assert_close(captured, plain)
    for rec in records.values():
        maps = rec["per_source"]
        assert sorted(maps) == [0, 1, 2]  # n = 3 encoder layers
        for w in maps.values():
            assert w.masked_select(pad[:, None, None, :]).abs().max() == 0
        sums = torch.stack([w.sum(-1) for w in maps.values()])
        if strategy == "flat":
            torch.testing.assert_close(sums.sum(0), torch.ones_like(sums[0]))
            torch.testing.assert_close(sum(maps.values()), rec["attention"])
        else:
            torch.testing.assert_close(sums, torch.ones_like(sums))
        if strategy == "parallel":  # the module returns the mean of its attentions
            torch.testing.assert_close(torch.stack(list(maps.values())).mean(0), rec["attention"])
        if strategy == "serial":  # the layer's own cross-attention reads f^n
            torch.testing.assert_close(maps[2], rec["attention"])
        assert (rec["beta"] is not None) == (strategy == "hierarchical")


def test_mma_heads_are_zero_outside_their_band(map_models):
    from fairseq_ext.modules.mixed_multihead_attention import mma_head_masks

    bin_dir, ckpts = map_models
    model, task, sample, target = one_sentence(ckpts["mma"], bin_dir)
    maps = attention_maps.attention_maps(model, task, sample, target)
    for entry, layer in zip(maps["encoder"], model.encoder.layers):
        assert entry["kind"] == "mma"
        assert entry["titles"]["global"] == ["h1 G (global)", "h2 L (local)", "h3 F (forward)", "h4 B (backward)"]
        w = entry["global"]  # H x T x T
        t = w.size(-1)
        allowed = mma_head_masks(layer.self_attn.head_types, t, t, window=1, causal=False)
        assert w.masked_select(~allowed).abs().max() == 0
        assert (~allowed[1:]).any(dim=(1, 2)).all()  # L, F and B each block something here
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
        # forward head: only j >= i; backward: only j <= i; local: |i - j| <= 1
        i, j = torch.meshgrid(torch.arange(t), torch.arange(t), indexing="ij")
        assert w[2][j < i].abs().max() == 0 and w[3][j > i].abs().max() == 0
        assert w[1][(i - j).abs() > 1].abs().max() == 0


def maps_by_hand(model, task, sentence, target_tokens):
    """What the attention maps of a hierarchical model are, computed here without the
    analysis: sentence ``sentence`` of 'test' translated by fairseq's own generator (beam 2,
    as the command was run), and, teacher-forcing ``target_tokens``, the second encoder
    layer's heads, decoder layer 1's first-level map over f^2 and decoder layer 2's weights
    over the two contexts (head-averaged, as the module does), each from its module's
    projections on the inputs a hook saw."""
    from fairseq.dataclass.configs import GenerationConfig

    dataset, tgt_dict = task.dataset("test"), task.target_dictionary
    one = dataset.collater([dataset[sentence]])
    generator = task.build_generator([model], GenerationConfig(beam=2, max_len_a=1.2, max_len_b=10))
    target = torch.tensor([tgt_dict.index(t) for t in target_tokens])
    seen = {}

    def keep(name):
        return lambda module, args, kwargs: seen.__setitem__(name, (
            kwargs.get("query", args[0] if args else None), kwargs.get("key", args[1] if len(args) > 1 else None),
            kwargs.get("key_padding_mask")))

    decoder = model.decoder.layers
    hooks = [m.register_forward_pre_hook(keep(name), with_kwargs=True) for name, m in (
        ("encoder", model.encoder.layers[1].self_attn), ("f^2", decoder[0].encoder_attn.source_attentions[1]),
        ("beta", decoder[1].encoder_attn.context_attention))]
    try:
        with torch.no_grad():
            best = task.inference_step(generator, [model], one)[0][0]["tokens"]
            seen.clear()
            net = one["net_input"]
            model(net["src_tokens"], net["src_lengths"], torch.cat([target[-1:], target[:-1]])[None])
            x, _, pad = seen["encoder"]
            encoder = attention_by_hand(model.encoder.layers[1].self_attn, x, x, pad)[0]
            query, key, pad = seen["f^2"]
            source = attention_by_hand(decoder[0].encoder_attn.source_attentions[1], query, key, pad)[0]
            query, contexts, pad = seen["beta"]  # each of the Z target positions attends its own n contexts
            beta = attention_by_hand(decoder[1].encoder_attn.context_attention, query, contexts, pad).mean(1)[:, 0]
    finally:
        for h in hooks:
            h.remove()
    return {"translation": [tgt_dict[int(t)] for t in best], "encoder L2": encoder.float(),
            "decoder L1 f^2": source.float(), "decoder L2 beta": beta.float()}


def test_attention_maps_command_figures_and_json(map_models, tmp_path):
    bin_dir, ckpts = map_models
    attention_maps.main(["--checkpoint", ckpts["hier"], "--data", bin_dir, "--split", "test", "--sentence", "3",
                         "--out", str(tmp_path / "hier"), "--cpu", "--beam", "2", "--names", "H 1"])
    # one figure per layer, named after --names (made safe for a file name)
    for png in ("H_1_encoder_self_attention_L1.png", "H_1_encoder_self_attention_L2.png",
                "H_1_decoder_attention_L1.png", "H_1_decoder_attention_L2.png", "H_1_context_weights.png"):
        assert (tmp_path / "hier" / png).read_bytes()[:8] == PNG_MAGIC
    saved = json.loads((tmp_path / "hier" / "attention_maps.json").read_text())
    assert saved["strategy"] == "hierarchical" and saved["source_names"] == ["f^1 (enc L1)", "f^2 (enc L2)"]
    assert saved["name"] == "H 1"
    model, task, sample, target = one_sentence(ckpts["hier"], bin_dir)
    by_hand = maps_by_hand(model, task, 3, saved["target_tokens"])
    assert saved["target_tokens"] == by_hand["translation"]
    assert saved["source_tokens"][0][-1] == "</s>" and len(saved["source_tokens"][0]) == sample["net_input"][
        "src_tokens"].size(1)
    torch.testing.assert_close(torch.tensor(saved["encoder"][1]["global"]), by_hand["encoder L2"], atol=2e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(saved["decoder"][0]["per_source"]["2"]), by_hand["decoder L1 f^2"],
                               atol=2e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(saved["decoder"][1]["beta"])[0], by_hand["decoder L2 beta"], atol=2e-6,
                               rtol=0)
    maps = attention_maps.attention_maps(model, task, sample, target)
    # figures: per encoder layer a panel per head; per decoder layer the combined map and each source's
    names = attention_maps.source_names(model, task)
    src = attention_maps.memory_labels(model, task, sample)
    tgt = saved["target_tokens"]
    about = {"name": "hier", "stem": "hier", "data": "bin, test", "sentence": "sentence 3 of 'test'",
             "translation": "its beam-2 translation"}
    figs = list(attention_maps.encoder_figures(maps, src[0], about, str(tmp_path)).values())
    assert len(figs) == 2 and [a.get_title() for a in figs[1].axes[:2]] == ["h1", "h2"]
    assert "hier: encoder self-attention, layer 2 (bin, test)" in [t.get_text() for t in figs[1].texts]
    figs = list(attention_maps.decoder_figures(maps, tgt, src, names, about, str(tmp_path)).values())
    assert [a.get_title() for a in figs[0].axes[:3]] == ["attention (combined)", "f^1 (enc L1)", "f^2 (enc L2)"]
    assert len(figs) == 2
    fig = attention_maps.context_figure(maps, tgt, names, about, str(tmp_path / "c.png"))
    assert len(fig.axes) == 2 + 1 and [t.get_text() for t in fig.axes[0].get_xticklabels()] == names
    # MMA: the head types in the titles; a given source and a given hypothesis, teacher-forced;
    # without --names the checkpoint's directory names it (fairseq's checkpoint_last.pt says nothing)
    out = attention_maps.run(Namespace(checkpoint=ckpts["mma"], data=bin_dir, split="test", sentence=None,
                                       source="w1 w2 w3", hypothesis="w3 w2 w1", reference=False, beam=2,
                                       max_len_a=1.2, max_len_b=10, out=str(tmp_path / "mma"), cpu=True))
    assert out["name"] == "mma" and (tmp_path / "mma" / "mma_encoder_self_attention_L2.png").is_file()
    assert out["target"] == ["w3", "w2", "w1", "</s>"] and out["source"] == [["w1", "w2", "w3", "</s>"]]
    layer1 = next(iter(out["figures"]["encoder"].values()))
    titles = [a.get_title() for a in layer1.axes if a.get_title()]
    assert titles == ["h1 G (global)", "h2 L (local)", "h3 F (forward)", "h4 B (backward)"]
    assert len(out["figures"]["decoder"]) == 2 and "context" not in out["figures"]
    assert out["maps"]["decoder"][0]["attention"].shape == (2, 4, 4)  # H x Z x J
    with pytest.raises(AnalysisError, match="--sentence 99"):
        attention_maps.main(["--checkpoint", ckpts["mma"], "--data", bin_dir, "--sentence", "99",
                             "--out", str(tmp_path / "x"), "--cpu"])


def png_width(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == PNG_MAGIC
    return int.from_bytes(head[16:20], "big")


def test_every_map_is_on_one_colour_scale_with_a_colour_bar(map_models, tmp_path):
    """unit: 0 to 1 in every figure; max: 0 to the largest weight drawn over every encoder
    layer and head (recomputed from the captured maps), and over every decoder map."""
    bin_dir, ckpts = map_models
    model, task, sample, target = one_sentence(ckpts["hier"], bin_dir)
    maps = attention_maps.attention_maps(model, task, sample, target)
    src = attention_maps.memory_labels(model, task, sample)
    tgt = attention_maps.token_labels(task.target_dictionary, target)
    names = attention_maps.source_names(model, task)
    about = {"name": "hier", "stem": "hier", "data": "bin, test", "sentence": "sentence 3 of 'test'",
             "translation": "its beam-2 translation"}
    for scale in ("unit", "max"):
        enc = attention_maps.encoder_figures(maps, src[0], about, str(tmp_path / scale), scale=scale)
        dec = attention_maps.decoder_figures(maps, tgt, src, names, about, str(tmp_path / scale), scale=scale)
        top_enc = max(float(e["global"].max()) for e in maps["encoder"])
        top_dec = max(float(m.mean(0).max()) for d in maps["decoder"]
                      for m in [d["attention"], *d["per_source"].values()])
        for drawn, top in ((enc, top_enc), (dec, top_dec)):
            expected = (0.0, 1.0) if scale == "unit" else (0.0, pytest.approx(top))
            for path, fig in drawn.items():
                images = [im for ax in fig.axes for im in ax.images]
                assert images and all(im.get_clim() == expected for im in images)
                bars = [ax for ax in fig.axes if not ax.images]
                assert len(bars) == 1 and bars[0].get_ylabel().startswith("attention weight")
                assert png_width(path) <= 1100


def test_mma_heads_are_labelled_by_their_type_in_maps_and_statistics(map_models, tmp_path):
    """The letters come from the model's own head assignment (--mma-heads G,L,F,B); over all
    keys the forward head spans a distance, read as printed (j <= i) it has none."""
    bin_dir, ckpts = map_models
    model, task = checkpoints.load_model(ckpts["mma"], bin_dir, split="valid", cpu=True)
    assert [capture.head_types(layer) for layer in model.encoder.layers] == [["G", "L", "F", "B"]] * 2
    types = capture.encoder_head_types(model)
    default = attention_stats.summarise("mma", attention_stats.collect(model, task, "valid", cpu=True), "all", types)
    left = attention_stats.summarise("mma", attention_stats.collect(model, task, "valid", span="left", cpu=True),
                                     "left", types)
    assert [r["type"] for r in default] == ["G", "L", "F", "B"] * 2
    forward = [(a["distance"], b["distance"]) for a, b in zip(default, left) if a["type"] == "F"]
    assert all(d_all > 0.5 and d_left == 0.0 for d_all, d_left in forward)
    backward = [(a["distance"], b["distance"]) for a, b in zip(default, left) if a["type"] == "B"]
    assert all(d_all == pytest.approx(d_left, abs=1e-4) for d_all, d_left in backward)  # only j <= i anyway
    fig = attention_stats.heatmaps(default, "mma", str(tmp_path / "h.png"))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["1\nG", "2\nL", "3\nF", "4\nB"]
    out = attention_maps.run(Namespace(checkpoint=ckpts["mma"], data=bin_dir, split="test", sentence=2, source=None,
                                       hypothesis=None, reference=True, beam=2, max_len_a=1.2, max_len_b=10,
                                       out=str(tmp_path / "maps"), cpu=True, names="MMA"))
    for fig in out["figures"]["encoder"].values():
        assert [a.get_title() for a in fig.axes if a.images] == ["h1 G (global)", "h2 L (local)", "h3 F (forward)",
                                                                 "h4 B (backward)"]
        caption = " ".join(" ".join(t.get_text().split()) for t in fig.texts)
        assert ("G = global (every key); L = local (|i - j| <= 1); F = forward (keys j >= i); B = backward "
                "(keys j <= i)") in caption
        assert "MMA: encoder self-attention, layer" in caption and "sentence 2 of 'test'" in caption


def test_a_long_sentence_is_cut_to_max_tokens_with_a_note(map_models, tmp_path):
    bin_dir, ckpts = map_models
    words = " ".join(f"w{k % 24}" for k in range(29))  # 29 tokens and the end of sentence
    attention_maps.main(["--checkpoint", ckpts["mma"], "--data", bin_dir, "--source", words, "--hypothesis", words,
                         "--max-tokens", "21", "--out", str(tmp_path), "--cpu", "--names", "mma"])
    saved = json.loads((tmp_path / "attention_maps.json").read_text())
    assert len(saved["source_tokens"][0]) == 30 and len(saved["encoder"][0]["global"][0]) == 30  # the JSON is uncut
    pngs = sorted(p for p in os.listdir(tmp_path) if p.endswith(".png"))
    assert pngs == ["mma_decoder_attention_L1.png", "mma_decoder_attention_L2.png",
                    "mma_encoder_self_attention_L1.png", "mma_encoder_self_attention_L2.png"]
    assert all(png_width(tmp_path / p) <= 1100 for p in pngs)
    # the same figure, built again: 21 of the 30 tokens drawn, and the caption says so
    model, task = checkpoints.load_model(ckpts["mma"], bin_dir, cpu=True)
    sample = attention_maps.sentence_sample(task, None, None, words)
    maps = attention_maps.attention_maps(model, task, sample, sample["net_input"]["src_tokens"][0])
    about = {"name": "mma", "stem": "mma", "data": "bin", "sentence": "the given --source sentence",
             "translation": "the teacher-forced --hypothesis"}
    fig = next(iter(attention_maps.encoder_figures(maps, saved["source_tokens"][0], about, str(tmp_path / "again"),
                                                   limit=21).values()))
    first = fig.axes[0]
    assert [t.get_text() for t in first.get_xticklabels()] == saved["source_tokens"][0][:21]
    assert first.images[0].get_array().shape == (21, 21)
    caption = " ".join(" ".join(t.get_text().split()) for t in fig.texts)
    assert "Only the first 21 of the 30 source tokens are drawn (--max-tokens 21)" in caption
    assert all(t.get_fontsize() >= figures.MIN_FONT_SIZE for a in fig.axes if a.images for t in a.get_xticklabels())


# ---- word order (MMA paper Table 3) ---------------------------------------------------------------

def test_positions_and_system_are_read_from_each_checkpoints_config(map_models):
    bin_dir, ckpts = map_models
    systems = word_order.pair_checkpoints([ckpts["hier_nopos"], ckpts["hier"], ckpts["mma"]], None)
    assert systems["Transformer + hierarchical"]["pos"]["checkpoint"] == ckpts["hier"]
    assert systems["Transformer + hierarchical"]["nopos"] == {"checkpoint": ckpts["hier_nopos"], "positions": "none"}
    assert systems["Transformer MMA"] == {"pos": {"checkpoint": ckpts["mma"], "positions": "sinusoidal"}}
    assert word_order.encoder_positions(Namespace(encoder_learned_pos=True)) == "learned"
    assert word_order.encoder_positions(Namespace(no_token_positional_embeddings=True)) == "none"
    with pytest.raises(AnalysisError, match="both 'x' with encoder positions"):
        word_order.pair_checkpoints([ckpts["hier"], ckpts["mma"]], ["x", "x"])


def test_word_order_table_with_known_bleu(map_models, tmp_path, monkeypatch):
    """The table's BLEU, delta, p and the Δ against the first system, with evaluate.sh
    replaced by fixed outputs whose scores sacreBLEU gives directly."""
    from fairseq_ext.tools.significance import paired_significance
    from fairseq_ext.tools.statistics import bleu_metric

    bin_dir, ckpts = map_models
    refs = [f"the cat number {i} sat on the mat today" for i in range(30)]
    outputs = {ckpts["hier"]: refs,
               ckpts["hier_nopos"]: [r.replace("sat", "stood") if i % 2 else r for i, r in enumerate(refs)],
               ckpts["mma"]: [r.replace("mat", "rug") if i % 3 else r for i, r in enumerate(refs)]}

    monkeypatch.setattr(decoding, "evaluate", fixed_decodings(outputs, refs, "detok-cased"))
    systems = word_order.pair_checkpoints([ckpts["hier"], ckpts["hier_nopos"], ckpts["mma"]], ["base", "base", "mma"])
    rows = word_order.word_order_rows(systems, bin_dir, "test", str(tmp_path), samples=100)
    assert [(r["model"], r["encoder positions"]) for r in rows] == [("base", "sinusoidal"), ("base", "none"),
                                                                    ("mma", "sinusoidal")]
    bleu = {c: round(bleu_metric("detok-cased").corpus_score(o, [refs]).score, 2) for c, o in outputs.items()}
    assert [r["BLEU"] for r in rows] == [bleu[ckpts["hier"]], bleu[ckpts["hier_nopos"]], bleu[ckpts["mma"]]]
    assert rows[1]["delta"] == pytest.approx(bleu[ckpts["hier_nopos"]] - bleu[ckpts["hier"]]) and rows[1]["delta"] < 0
    sig = paired_significance(refs, outputs[ckpts["hier"]], {"x": outputs[ckpts["hier_nopos"]]}, n_samples=100,
                              marks="mma")
    assert (rows[1]["p"], rows[1]["mark"]) == (sig["x"]["p_value"], sig["x"]["mark"]) and rows[1]["mark"] == "††"
    assert rows[0]["delta"] is None and rows[2]["delta"] is None
    assert rows[2]["Δ vs base"] == pytest.approx(bleu[ckpts["mma"]] - bleu[ckpts["hier"]])
    assert rows[0]["Δ vs base"] is None and rows[1]["Δ vs base"] is None
    fig = word_order.plot(rows, str(tmp_path / "wo.png"))
    assert len(fig.axes) == 1 and len(fig.axes[0].patches) == 3
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["base", "mma"]
    assert (tmp_path / "wo.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_word_order_command_through_evaluate(map_models, tmp_path):
    """Both checkpoints decoded by evaluate.sh: one row each, the positions read from each
    configuration (given in the 'wrong' order), delta = the difference of the BLEUs."""
    bin_dir, ckpts = map_models
    word_order.main(["--checkpoint", ckpts["hier_nopos"], ckpts["hier"], "--data", bin_dir, "--split", "valid",
                     "--out", str(tmp_path), "--cpu", "--samples", "50", "--generate-args", "--beam 2 --max-len-b 8"])
    rows = json.loads((tmp_path / "word_order.json").read_text())
    assert [(r["model"], r["encoder positions"], r["checkpoint"]) for r in rows] == [
        ("Transformer + hierarchical", "sinusoidal", ckpts["hier"]),
        ("Transformer + hierarchical", "none", ckpts["hier_nopos"])]
    by_hand = json.loads((tmp_path / "Transformer_hierarchical" / "nopos" / "bleu.json").read_text())
    assert rows[1]["BLEU"] == pytest.approx(by_hand[rows[1]["flavour"]]["score"], abs=0.005)
    assert rows[1]["delta"] == pytest.approx(rows[1]["BLEU"] - rows[0]["BLEU"], abs=1e-9)
    assert (tmp_path / "word_order.png").read_bytes()[:8] == PNG_MAGIC
    assert "| Transformer + hierarchical | none |" in (tmp_path / "word_order.md").read_text()
