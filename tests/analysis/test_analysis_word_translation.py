"""word_translation and translate_from_layer (Xu et al. 2020, "Analyzing Word Translation of
Transformer Layers", Sec. 2-3, Tables 1-3 and 5): the merged alignment (Eq. 1-3) against the
model's own cross-attention, the frozen model and classifier, the bypassed sublayers against a
layer recomputed by hand, accuracy and BLEU against direct computations, and both commands
end to end on a tiny trained model."""
import json
import math
import os

import pytest
import torch

from fairseq_ext.common import checkpoints
from fairseq_ext.analysis import translate_from_layer, word_translation
from fairseq_ext.analysis.command import batches
from model_utils import make_tiny_parallel_data, train_tiny
from joint_attention_reference import attention_by_hand

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny post-norm model (2 + 2 layers, 2 heads, d 32) trained a few updates on the
    reversal task, loaded on the CPU with train / valid / test."""
    root = tmp_path_factory.mktemp("word_translation")
    bin_dir = make_tiny_parallel_data(str(root), num_train=121)
    ckpt = train_tiny(bin_dir, root / "std", max_update=8)
    model, task = checkpoints.load_model(ckpt, bin_dir, cpu=True)
    for split in ("train", "valid", "test"):
        task.load_dataset(split)
    return {"root": root, "bin": bin_dir, "ckpt": ckpt, "model": model, "task": task}


def first_batch(task, split="valid", max_tokens=4000):
    return next(iter(batches(task, split, max_tokens)))


def captured_cross_attention_inputs(model, sample):
    """Each decoder layer's cross-attention inputs (query, key, padding mask), as the layer
    hands them, from one teacher-forced forward."""
    seen = {}
    hooks = [layer.encoder_attn.register_forward_pre_hook(
        lambda m, a, k, i=i: seen.__setitem__(i, (k["query"], k["key"], k["key_padding_mask"])), with_kwargs=True)
        for i, layer in enumerate(model.decoder.layers)]
    try:
        with torch.no_grad():
            net = sample["net_input"]
            enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"], return_all_hiddens=True)
            model.decoder(net["prev_output_tokens"], encoder_out=enc, features_only=True)
    finally:
        for h in hooks:
            h.remove()
    return seen, enc


# ---- Eq. 1-3: the merged alignment ------------------------------------------------------

def test_merged_alignment_is_eq_1_to_3_over_the_models_cross_attention(tiny):
    model, task = tiny["model"], tiny["task"]
    sample = first_batch(task)
    names = ["enc0", "enc1", "enc2"]
    feats = word_translation.frozen_features(model, sample, names)
    attn = feats["attn"]  # B x (M H) x T x S, layer-major
    layers = model.decoder.layers
    heads = layers[0].encoder_attn.num_heads
    bsz, tgt_len = sample["target"].shape
    src_len = sample["net_input"]["src_tokens"].size(1)
    assert attn.shape == (bsz, len(layers) * heads, tgt_len, src_len)
    # A_i: the i-th head of the layer-major list, recomputed from each layer's projections
    seen, enc = captured_cross_attention_inputs(model, sample)
    with torch.no_grad():
        by_hand = torch.cat([attention_by_hand(layers[m].encoder_attn, *seen[m]) for m in range(len(layers))], 1)
    torch.testing.assert_close(attn.double(), by_hand, atol=1e-5, rtol=1e-4)

    torch.manual_seed(3)
    w = torch.randn(len(layers) * heads, dtype=torch.float64)
    p = torch.exp(w) / torch.exp(w).sum()  # Eq. 1
    states = [s.transpose(0, 1).double() for s in enc["encoder_states"]]  # post-norm: no final LayerNorm
    for l in range(3):
        torch.testing.assert_close(feats[f"enc{l}"].double(), states[l])
    probe = word_translation.LayerProbe(32, 32, alignment_size=len(layers) * heads)  # float32, as it runs
    with torch.no_grad():
        probe.w.copy_(w)
        probe.projection.weight.copy_(torch.randn(32, 32))
        got = probe(states[1].float(), by_hand.float()).double()
    weight = probe.projection.weight.detach().double()
    for b in range(bsz):
        a = sum(p[i] * by_hand[b, i].t() for i in range(len(p)))  # Eq. 2, A: source x target
        t_e = a.t() @ states[1][b]  # Eq. 3: T_E = A^T x E, target length x d
        torch.testing.assert_close(got[b], t_e @ weight.t(), atol=1e-4, rtol=1e-4)
        # every target row of A^T is a distribution over the real source tokens
        real = sample["net_input"]["src_tokens"][b].ne(task.source_dictionary.pad())
        torch.testing.assert_close(a[real].sum(0), torch.ones(tgt_len, dtype=torch.float64))
        assert float(a[~real].abs().sum()) == 0.0


def test_projection_is_d_by_d_without_bias_and_only_the_probes_are_trained(tiny):
    model, task = tiny["model"], tiny["task"]
    names = word_translation.probe_names(2, 2, word_translation.PARTS)
    assert names == ["enc0", "enc1", "enc2", "dec0", "dec1", "dec2", "dec1-self", "dec2-self", "dec1-cross",
                     "dec2-cross"]
    probes = word_translation.build_probes(model, names)
    for name, probe in probes.items():
        assert probe.projection.weight.shape == (32, 32) and probe.projection.bias is None
        torch.testing.assert_close(probe.projection.weight, torch.eye(32))  # identity at the start
        assert (probe.w is not None) == name.startswith("enc")
        if probe.w is not None:
            assert probe.w.shape == (2 * 2,)  # one weight per decoder layer x head (the paper's 48)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    initial = word_translation.evaluate_probes(model, task, "valid", probes)
    best = word_translation.train_probes(model, task, probes, "train", "valid", lr=1e-2, max_epoch=3,
                                         validate_interval=0, log=open(os.devnull, "w"))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # model and classifier frozen
    assert not any(p.requires_grad for p in model.decoder.output_projection.parameters())
    moved = [n for n in names if not torch.equal(probes[n].projection.weight, torch.eye(32))]
    assert moved  # the projections were trained
    final = word_translation.evaluate_probes(model, task, "valid", probes)
    for name in names:  # each probe keeps its best validation parameters (never worse than the start)
        assert final[name]["accuracy"] == pytest.approx(best[name])
        assert best[name] >= initial[name]["accuracy"]


# ---- accuracy ----------------------------------------------------------------------------

def test_accuracy_by_hand_on_two_sentences(tiny):
    """Identity projections: the top decoder layer is the model itself; every count is the
    argmax over the whole vocabulary equal to the gold token, padding excluded, EOS counted."""
    model, task = tiny["model"], tiny["task"]
    names = ["enc1", "dec0", "dec2"]
    probes = word_translation.build_probes(model, names)
    torch.manual_seed(0)
    with torch.no_grad():
        probes["enc1"].w.copy_(torch.randn(4))
        probes["dec0"].projection.weight.copy_(torch.randn(32, 32))
    scores = word_translation.evaluate_probes(model, task, "test", probes, max_sentences=2)
    ds = task.dataset("test")
    pad = task.target_dictionary.pad()
    counts = {n: [0, 0] for n in [*names, "model"]}
    with torch.no_grad():
        for i in range(2):
            sample = ds.collater([ds[i]])
            net = sample["net_input"]
            target = sample["target"][0]
            logits, _ = model(**net)
            enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"], return_all_hiddens=True)
            _, extra = model.decoder(net["prev_output_tokens"], encoder_out=enc, features_only=True)
            seen, _ = captured_cross_attention_inputs(model, sample)
            attn = torch.cat([attention_by_hand(model.decoder.layers[m].encoder_attn, *seen[m]).float()
                              for m in range(2)], 1)[0]  # 4 x T x S
            p = torch.softmax(probes["enc1"].w, 0)
            t_e = torch.einsum("k,kts->ts", p, attn) @ enc["encoder_states"][1][:, 0]
            preds = {"model": logits[0].argmax(-1),
                     "enc1": model.decoder.output_layer(t_e).argmax(-1),
                     "dec0": model.decoder.output_layer(probes["dec0"].projection(extra["inner_states"][0][:, 0]))
                     .argmax(-1),
                     "dec2": model.decoder.output_layer(extra["inner_states"][2][:, 0]).argmax(-1)}
            for n, pred in preds.items():
                counts[n][0] += int((pred == target).sum())
                counts[n][1] += int(target.ne(pad).sum())
    for n, (correct, total) in counts.items():
        assert scores[n]["total"] == total == len(task.dataset("test").tgt[0]) + len(task.dataset("test").tgt[1])
        assert scores[n]["correct"] == correct, n
    assert scores["dec2"]["correct"] == scores["model"]["correct"]


def test_table_deltas_are_differences_of_unrounded_accuracies():
    scores = {n: {"accuracy": a} for n, a in (("enc0", 1 / 3), ("enc1", 0.5), ("dec0", 0.1), ("dec1", 7 / 12),
                                              ("dec1-self", 0.35), ("dec1-cross", 11 / 24))}
    rows = word_translation.table_rows(scores, 1, 1)
    assert rows[0]["encoder"] == 33.33 and rows[0]["encoder delta"] is None
    assert rows[1]["encoder delta"] == 16.67 and rows[1]["decoder delta"] == round(100 * (7 / 12 - 0.1), 2)
    assert rows[1]["-self delta"] == round(100 * (0.35 - 7 / 12), 2)  # a loss: negative, as Table 1
    assert rows[1]["-cross delta"] == -12.5


# ---- the bypassed sublayers ---------------------------------------------------------------

def _layer_by_hand(layer, x, enc, enc_pad, self_mask, self_pad, drop):
    """fairseq's post-norm decoder layer (eval) with the ``drop``ped sublayer's output zero."""
    assert not layer.normalize_before
    if drop == "self":
        x = layer.self_attn_layer_norm(x)
    else:
        h, _ = layer.self_attn(x, x, x, key_padding_mask=self_pad, attn_mask=self_mask, need_weights=False)
        x = layer.self_attn_layer_norm(x + h)
    if drop == "cross":
        x = layer.encoder_attn_layer_norm(x)
    else:
        h, _ = layer.encoder_attn(x, enc, enc, key_padding_mask=enc_pad, static_kv=True, need_weights=False)
        x = layer.encoder_attn_layer_norm(x + h)
    h = layer.fc2(layer.activation_fn(layer.fc1(x)))
    return layer.final_layer_norm(x + h)


@pytest.mark.parametrize("drop", ["self", "cross", None])
def test_bypassed_sublayer_leaves_the_residual_path(tiny, drop):
    model, task = tiny["model"], tiny["task"]
    sample = first_batch(task)
    net = sample["net_input"]
    prev = net["prev_output_tokens"]
    with torch.no_grad():
        enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"], return_all_hiddens=True)
        _, extra = model.decoder(prev, encoder_out=enc, features_only=True)
        inner = extra["inner_states"]
        self_pad = prev.eq(task.target_dictionary.pad())
        for index in (0, 1):
            layer = model.decoder.layers[index]
            x_in = inner[index]  # the layers below are unchanged
            expected = _layer_by_hand(layer, x_in, enc["encoder_out"][0], enc["encoder_padding_mask"][0],
                                      model.decoder.buffered_future_mask(x_in),
                                      self_pad if self_pad.any() else None, drop)
            sublayer = word_translation.SUBLAYER.get(drop)
            got = word_translation.layer_output(model, index, prev, enc, sublayer)
            real = ~self_pad.t()
            torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
            if drop is None:
                torch.testing.assert_close(got, inner[index + 1])
        # the hooks are gone after use: the model runs as before
        _, again = model.decoder(prev, encoder_out=enc, features_only=True)
        torch.testing.assert_close(again["inner_states"][-1], inner[-1])
    if drop is not None:
        feats = word_translation.frozen_features(model, sample, [f"dec2-{drop}", "dec2"])
        assert not torch.allclose(feats[f"dec2-{drop}"], feats["dec2"])
        torch.testing.assert_close(feats[f"dec2-{drop}"], word_translation.layer_output(
            model, 1, prev, enc, word_translation.SUBLAYER[drop]).transpose(0, 1))


# ---- translate_from_layer -----------------------------------------------------------------

def test_bleu_and_bleu1_of_known_strings_against_sacrebleu():
    import sacrebleu

    hyps = ["A b c d", "e f", "g h i j k"]
    refs = ["a b x d", "e f g", "g h i j k"]
    got = translate_from_layer.bleu_scores(hyps, refs)
    # BLEU-1 = brevity penalty x unigram precision, lowercased: (3 + 2 + 5) / 11 matches, 11 vs 12 tokens
    assert got["BLEU-1"] == pytest.approx(100 * math.exp(1 - 12 / 11) * 10 / 11)
    assert got["BLEU"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", lowercase=True).score)
    assert got["BLEU"] < got["BLEU-1"]
    perfect = translate_from_layer.bleu_scores(refs, refs)
    assert perfect == {"BLEU-1": pytest.approx(100.0), "BLEU": pytest.approx(100.0)}


@pytest.mark.slow
def test_word_translation_and_translate_from_layer_commands(tiny, tmp_path):
    bin_dir, ckpt = tiny["bin"], tiny["ckpt"]
    wt = tmp_path / "wt"
    word_translation.main(["--checkpoint", ckpt, "--data", bin_dir, "--split", "test", "--out", str(wt), "--cpu",
                           "--max-epoch", "2", "--validate-interval", "0", "--lr", "1e-2"])
    rows = json.loads((wt / "word_translation.json").read_text())
    assert [r["layer"] for r in rows] == [0, 1, 2]
    assert rows[0]["-self attention"] is None and rows[1]["-self attention"] is not None
    assert all(r[k] is not None for r in rows for k in ("encoder", "decoder"))
    last = json.loads((wt / "last_layer.json").read_text())
    assert last[0]["accuracy"] == rows[2]["decoder"]
    assert (wt / "word_translation.png").read_bytes()[:8] == PNG_MAGIC
    for name in ("word_translation.md", "word_translation.csv", "last_layer.md", "projections.pt"):
        assert (wt / name).exists()
    # the table's numbers are the saved projections evaluated on the split
    model, task = checkpoints.load_model(ckpt, bin_dir, split="test", cpu=True)
    names = word_translation.probe_names(2, 2, word_translation.PARTS)
    probes = word_translation.load_projections(model, str(wt / "projections.pt"), names)
    scores = word_translation.evaluate_probes(model, task, "test", probes)
    assert rows[1]["encoder"] == round(100 * scores["enc1"]["accuracy"], 2)
    assert rows[2]["-cross attention"] == round(100 * scores["dec2-cross"]["accuracy"], 2)

    tl = tmp_path / "tl"
    translate_from_layer.main(["--checkpoint", ckpt, "--data", bin_dir, "--split", "test", "--out", str(tl),
                               "--cpu", "--projections", str(wt / "projections.pt"), "--beam", "2"])
    table = json.loads((tl / "translate_from_layer.json").read_text())
    assert [r["layer"] for r in table] == [0, 1, 2, "FULL"]
    assert (tl / "translate_from_layer.png").read_bytes()[:8] == PNG_MAGIC
    raw = os.path.join(os.path.dirname(bin_dir), "raw")
    with open(os.path.join(raw, "test.src")) as f:
        sources = [line.split() for line in f]
    with open(os.path.join(raw, "test.tgt")) as f:
        references = [line.strip() for line in f]
    assert (tl / "ref.bpe").read_text().splitlines() == references
    hyps = {}
    for key in ("layer0", "layer1", "layer2", "full"):
        hyps[key] = (tl / f"hyp.{key}.bpe").read_text().splitlines()
        assert len(hyps[key]) == len(sources)
    for key in ("layer0", "layer1", "layer2"):
        for src, hyp in zip(sources, hyps[key]):
            assert len(hyp.split()) == len(src)  # one target token per source token, no specials
            assert not {"</s>", "<pad>", "<s>"} & set(hyp.split())
        scores = translate_from_layer.bleu_scores(hyps[key], references)
        row = table[int(key[5:])]
        assert row["BLEU-1"] == round(scores["BLEU-1"], 2) and row["BLEU"] == round(scores["BLEU"], 2)
    # each layer's hypothesis is the argmax of its projection through the classifier
    probes = word_translation.load_projections(model, str(wt / "projections.pt"), ["enc0", "enc1", "enc2"])
    ds = task.dataset("test")
    sample = ds.collater([ds[0]])
    with torch.no_grad():
        enc = model.encoder(sample["net_input"]["src_tokens"], src_lengths=sample["net_input"]["src_lengths"],
                            return_all_hiddens=True)
        logits = model.decoder.output_layer(probes["enc2"].projection(enc["encoder_states"][2][:-1, 0]))
    tgt_dict = task.target_dictionary
    logits[:, [tgt_dict.pad(), tgt_dict.eos(), tgt_dict.bos()]] = float("-inf")
    assert hyps["layer2"][0] == " ".join(tgt_dict[int(t)] for t in logits.argmax(-1))
    # FULL: the whole model's beam search, its delta over the top encoder layer
    full = translate_from_layer.bleu_scores(hyps["full"], references)
    top = translate_from_layer.bleu_scores(hyps["layer2"], references)
    assert table[3]["BLEU"] == round(full["BLEU"], 2)
    assert table[3]["BLEU-1 delta"] == round(full["BLEU-1"] - top["BLEU-1"], 2)
