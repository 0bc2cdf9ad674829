"""The analysis commands (fairseq_ext/analysis): each number against a direct computation,
figures checked for their panels and series, on tiny trained models."""
import json
import math
import os

import pytest
import torch

from fairseq_ext.common import checkpoints
from fairseq_ext.analysis import AnalysisError, attention_stats, decoders, layer_dependency, length_buckets
from fairseq_ext.analysis.command import batches
from fairseq_ext.analysis.capture import capture_self_attention
from model_utils import make_tiny_parallel_data, train_tiny

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """Three tiny checkpoints on one synthetic task (121 training pairs): standard, Dual
    Contextual encoder, and M-00 + MS-1 (masking and auxiliary decoders)."""
    root = tmp_path_factory.mktemp("analysis")
    bin_dir = make_tiny_parallel_data(str(root), num_train=121)
    # what a recipe would record (evaluate.sh reads the languages and the subword kind here)
    with open(os.path.join(bin_dir, "prep.env"), "w") as f:
        f.write("recipe=tiny\nsrc=src\ntgt=tgt\nbpe=none\n")
    ckpts = {}
    for name, extra in (("std", []), ("dc", ["--encoder-self-attention", "dc"]),
                        ("m00ms", ["--joint-attention", "m-00", "--aux-decoder-layers", "1", "--criterion",
                                   "multi_output_label_smoothed_cross_entropy"])):
        ckpts[name] = train_tiny(bin_dir, root / name, *extra)
    return bin_dir, ckpts


# ---- attention distance and entropy (Eq. 13-16) ------------------------------------------

def test_distance_and_entropy_of_a_hand_made_attention_matrix():
    # one sentence of 3 tokens left-padded to 4; two heads
    pad = torch.tensor([[True, False, False, False]])
    w = torch.zeros(1, 2, 4, 4)
    w[0, 0, 1:, 1:] = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])  # causal-ish head
    w[0, 1, 1:, 1:] = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])  # looks at the last token
    s = attention_stats.head_statistics(w, pad, "left")
    # head 0, j <= i: distance sum = 0 + (0.5*1) + (0.2*2 + 0.3*1) = 1.2; weight sum = 1 + 1 + 1 = 3
    assert s["distance"][0].item() == pytest.approx(1.2) and s["weight"][0].item() == pytest.approx(3.0)
    ent0 = -(0.5 * math.log(0.5)) * 2 - (0.2 * math.log(0.2) + 0.3 * math.log(0.3) + 0.5 * math.log(0.5))
    assert s["entropy"][0].item() == pytest.approx(ent0) and s["tokens"][0].item() == 3
    # head 1 as printed sees only its j <= i part: the last token from i = 3 (distance 0)
    assert s["weight"][1].item() == pytest.approx(1.0) and s["distance"][1].item() == pytest.approx(0.0)
    a = attention_stats.head_statistics(w, pad)  # the default: every key, d = |i - j|
    assert a["distance"][1].item() == pytest.approx(2 + 1 + 0) and a["weight"][1].item() == pytest.approx(3.0)
    assert a["entropy"][1].item() == pytest.approx(0.0)
    # the padding row and column never count
    w2 = w.clone()
    w2[0, :, 0, :] = 0.25
    w2[0, :, :, 0] = 0.3
    assert attention_stats.head_statistics(w2, pad, "all")["tokens"].tolist() == [3.0, 3.0]


@pytest.mark.parametrize("name", ["std", "dc"])
def test_captured_weights_are_the_models_own_attention(tiny_models, name):
    """The weights the analysis reads are those the encoder layer computes: recomputed here by
    calling each layer's self-attention on that layer's input, with every head."""
    bin_dir, ckpts = tiny_models
    model, task = checkpoints.load_model(ckpts[name], bin_dir, split="valid", cpu=True)
    inputs = {}
    hooks = [layer.register_forward_pre_hook(lambda m, a, k, i=i: inputs.__setitem__(i, (a, k)), with_kwargs=True)
             for i, layer in enumerate(model.encoder.layers)]
    sample = next(iter(batches(task, "valid")))
    net = sample["net_input"]
    with torch.no_grad():
        with capture_self_attention(model) as records:
            model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        for h in hooks:
            h.remove()
        for i, layer in enumerate(model.encoder.layers):  # the hooks are gone: the layer as it runs
            args, kwargs = inputs[i]
            x = args[0]
            pad = args[1] if len(args) > 1 else kwargs.get("encoder_padding_mask")
            got = records[i]["global"][0]
            heads = layer.self_attn.num_heads
            assert got.shape == (x.size(1), heads, x.size(0), x.size(0))  # every head, not their mean
            # their mean is what the layer's attention returns as its (head-averaged) weights
            _, mean = layer.self_attn(x, x, x, key_padding_mask=pad, need_weights=True)
            torch.testing.assert_close(got.mean(1), mean.float(), atol=1e-6, rtol=1e-5)
            if name == "std":  # and each head is softmax(q k^T / sqrt(d)) of the layer's projections
                attn = layer.self_attn
                d = x.size(-1) // heads
                q = attn.q_proj(x).view(x.size(0), x.size(1), heads, d).permute(1, 2, 0, 3) * d ** -0.5
                k = attn.k_proj(x).view(x.size(0), x.size(1), heads, d).permute(1, 2, 0, 3)
                logits = (q @ k.transpose(-1, -2)).masked_fill(pad[:, None, None, :], float("-inf"))
                torch.testing.assert_close(got, torch.softmax(logits, -1), atol=1e-6, rtol=1e-5)
            expected = got.transpose(0, 1)
            if name == "dc":
                local = records[i]["local"][0]
                assert local.shape == expected.transpose(0, 1).shape
                torch.testing.assert_close(local.sum(-1)[~pad[:, None, :].expand_as(local[..., 0])],
                                           torch.ones_like(local.sum(-1)[~pad[:, None, :].expand_as(local[..., 0])]))
            else:
                assert records[i]["local"] == []


def test_attention_stats_command(tiny_models, tmp_path):
    bin_dir, ckpts = tiny_models
    attention_stats.main(["--checkpoint", ckpts["std"], ckpts["dc"], "--names", "std", "dc", "--data", bin_dir,
                          "--split", "valid", "--out", str(tmp_path), "--cpu"])
    per_head = json.loads((tmp_path / "per_head.json").read_text())
    assert {(r["model"], r["unit"]) for r in per_head} == {("std", "global"), ("dc", "global"), ("dc", "local")}
    # the default reading is over all keys, and every table says so
    assert {r["span"] for r in per_head} == {"all"} and {r["type"] for r in per_head} == {None}
    for table in ("per_head", "per_layer"):
        assert "over all keys j, d = |i - j|: bin, valid (30 sentences)" in (tmp_path / f"{table}.md").read_text()
    assert len([r for r in per_head if r["model"] == "std"]) == 2 * 2  # 2 layers x 2 heads
    # the command's numbers equal a direct computation over the whole split: head 2 of layer 1,
    # sentence by sentence on its own tokens (padding cut away), d = |i - j| (Eq. 13, 15)
    model, task = checkpoints.load_model(ckpts["std"], bin_dir, split="valid", cpu=True)
    distance = weight = entropy = tokens = 0.0
    for sample in batches(task, "valid"):
        net = sample["net_input"]
        with torch.no_grad(), capture_self_attention(model) as records:
            model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        for b, real in enumerate(net["src_tokens"].ne(task.source_dictionary.pad())):
            w = records[0]["global"][0][b, 1][real][:, real].double()  # n x n
            n = w.size(0)
            d = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
            distance += float((w * d).sum())
            weight += float(w.sum())
            entropy += float(-(w * torch.log(w.clamp(min=1e-30))).sum())
            tokens += n
    row = next(r for r in per_head if r["model"] == "std" and r["layer"] == 1 and r["head"] == 2)
    assert row["distance"] == pytest.approx(distance / weight, abs=1e-4)
    assert row["entropy"] == pytest.approx(entropy / tokens, abs=1e-4)
    for png in ("heatmaps_std.png", "heatmaps_dc.png", "layers.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC
    rows = attention_stats.per_layer(per_head)
    fig = attention_stats.heatmaps(per_head, "dc", str(tmp_path / "again.png"))
    assert len([a for a in fig.axes if a.get_title()]) == 4  # (global, local) x (distance, entropy)
    # global and local FI unit (and std) on one scale per quantity
    clims = [a.images[0].get_clim() for a in fig.axes if a.images]
    assert clims[0] == clims[2] and clims[1] == clims[3]
    assert clims[0] == (min(r["distance"] for r in per_head), max(r["distance"] for r in per_head))
    fig = attention_stats.layer_plot(rows, str(tmp_path / "layers2.png"))
    assert len(fig.axes[0].lines) == 3  # std, dc global, dc local


# ---- BLEU by length ------------------------------------------------------------------------

def test_bucket_bleu_equals_sacrebleu_on_the_subset():
    from sacrebleu.metrics import BLEU

    sources = ["a " * n for n in (3, 9, 10, 15, 25, 60, 12)]
    refs = ["the cat sat on the mat", "a b c d", "x y z w v", "one two three four", "p q r s t u",
            "m n o p q", "good day to you"]
    hyps = ["the cat sat on a mat", "a b c e", "x y z w", "one two three four", "p q r", "m n o p q",
            "good day"]
    rows = length_buckets.bucket_bleu([len(s.split()) for s in sources], refs, {"sys": hyps}, "detok-cased")
    assert [r["bucket"] for r in rows] == ["<10", "10-20", "20-30", "30-40", "40-50", ">=50"]
    assert [r["sentences"] for r in rows] == [2, 3, 1, 0, 0, 1]
    idx = [2, 3, 6]  # 10 <= length < 20
    expected = BLEU().corpus_score([hyps[i] for i in idx], [[refs[i] for i in idx]]).score
    assert rows[1]["sys"] == pytest.approx(round(expected, 2)) and rows[3]["sys"] is None


# ---- layer masking and decoders (through evaluate.sh) ----------------------------------------

def bleu_by_hand(checkpoint, bin_dir, overrides, flavour):
    """The BLEU of ``checkpoint`` with the model overrides ``overrides`` on the valid split,
    decoded here with fairseq's own generator (beam 2, output length at most 8, as
    fairseq-generate would) and scored by sacreBLEU against the split's references."""
    from fairseq.dataclass.configs import GenerationConfig

    from fairseq_ext.tools.statistics import bleu_metric

    model, task = checkpoints.load_model(checkpoint, bin_dir, split="valid", overrides=overrides, cpu=True)
    generator = task.build_generator([model], GenerationConfig(beam=2, max_len_b=8))
    dataset, tgt_dict = task.dataset("valid"), task.target_dictionary
    hyps = {}
    with torch.no_grad():
        for sample in batches(task, "valid"):
            for i, hypos in zip(sample["id"].tolist(), task.inference_step(generator, [model], sample)):
                hyps[i] = tgt_dict.string(hypos[0]["tokens"])
    refs = [tgt_dict.string(dataset[i]["target"]) for i in range(len(dataset))]
    return bleu_metric(flavour).corpus_score([hyps[i] for i in range(len(dataset))], [refs]).score


@pytest.mark.slow
def test_layer_dependency_and_decoders_commands(tiny_models, tmp_path):
    """Masking f^i through the command equals a decoding with the model built with
    mask_source_layer i, done by hand; the auxiliary decoder's BLEU equals a decoding of the
    model with decode_from aux1; significance from the same files."""
    bin_dir, ckpts = tiny_models
    layer_dependency.main(["--checkpoint", ckpts["m00ms"], "--names", "m00", "--data", bin_dir, "--split", "valid",
                           "--out", str(tmp_path / "mask"), "--cpu", "--samples", "50", "--generate-args",
                           "--beam 2 --max-len-b 8"])
    rows = json.loads((tmp_path / "mask" / "masking.json").read_text())
    assert [r["masked layer"] for r in rows] == ["none", "f^1", "f^2"]
    by_hand = bleu_by_hand(ckpts["m00ms"], bin_dir, {"mask_source_layer": 2}, rows[2]["flavour"])
    assert rows[2]["BLEU"] == pytest.approx(by_hand, abs=0.01)
    assert rows[2]["delta"] == pytest.approx(rows[2]["BLEU"] - rows[0]["BLEU"], abs=0.011)
    assert (tmp_path / "mask" / "masking.png").read_bytes()[:8] == PNG_MAGIC
    decoders.main(["--checkpoint", ckpts["m00ms"], "--names", "m00", "--data", bin_dir, "--split", "valid",
                   "--out", str(tmp_path / "dec"), "--cpu", "--samples", "50", "--generate-args", "--beam 2 --max-len-b 8"])
    drows = json.loads((tmp_path / "dec" / "decoders.json").read_text())
    assert [r["decoder"] for r in drows] == ["main", "aux1"] and drows[1]["reads encoder layer"] == 1
    aux = bleu_by_hand(ckpts["m00ms"], bin_dir, {"decode_from": "aux1"}, drows[1]["flavour"])
    assert drows[1]["BLEU"] == pytest.approx(aux, abs=0.01)
    with pytest.raises(AnalysisError, match="no auxiliary decoder"):
        decoders.main(["--checkpoint", ckpts["std"], "--data", bin_dir, "--split", "valid", "--out",
                       str(tmp_path / "x"), "--cpu"])
    with pytest.raises(AnalysisError, match="there is no layer to mask"):
        layer_dependency.main(["--checkpoint", ckpts["std"], "--data", bin_dir, "--split", "valid", "--out",
                               str(tmp_path / "y"), "--cpu"])


# ---- DC divergence (thesis 5.6.2) -------------------------------------------------------------

def test_js_divergence_is_symmetric_zero_for_identical_and_ln2_for_disjoint():
    from fairseq_ext.analysis.dc_divergence import js_divergence

    p = torch.tensor([0.1, 0.6, 0.3])
    q = torch.tensor([0.5, 0.25, 0.25])
    m = (p + q) / 2
    expected = 0.5 * (p * (p / m).log()).sum() + 0.5 * (q * (q / m).log()).sum()
    assert js_divergence(p, q).item() == pytest.approx(expected.item())
    assert js_divergence(p, q).item() == pytest.approx(js_divergence(q, p).item())
    assert js_divergence(p, p).item() == pytest.approx(0.0, abs=1e-7)
    assert js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx(math.log(2))


def test_dc_divergence_command_equals_a_direct_computation(tiny_models, tmp_path):
    from fairseq_ext.analysis import dc_divergence

    bin_dir, ckpts = tiny_models
    dc_divergence.main(["--checkpoint", ckpts["dc"], "--names", "f2", "--data", bin_dir, "--split", "valid",
                        "--out", str(tmp_path), "--cpu", "--heads", "mean"])
    rows = json.loads((tmp_path / "per_layer.json").read_text())
    assert [r["layer"] for r in rows] == [1, 2]
    model, task = checkpoints.load_model(ckpts["dc"], bin_dir, split="valid", cpu=True)
    total, count = 0.0, 0
    with torch.no_grad(), capture_self_attention(model) as records:
        for sample in batches(task, "valid"):
            for r in records.values():
                r["global"].clear(), r["local"].clear()
            net = sample["net_input"]
            model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            keep = net["src_tokens"].ne(task.source_dictionary.pad())
            g, l = records[1]["global"][0].mean(1), records[1]["local"][0].mean(1)
            for b in range(g.size(0)):
                for t in range(g.size(1)):
                    if keep[b, t]:
                        m = (g[b, t] + l[b, t]) / 2
                        kl = lambda a: float((a[a > 0] * (a[a > 0] / m[a > 0]).log()).sum())
                        total += 0.5 * kl(g[b, t]) + 0.5 * kl(l[b, t])
                        count += 1
    assert rows[1]["JS"] == pytest.approx(total / count, abs=1e-5)
    assert json.loads((tmp_path / "summary.json").read_text())[0]["Ed"] == pytest.approx(
        (rows[0]["JS"] + rows[1]["JS"]) / 2, abs=1e-5)
    assert (tmp_path / "dc_divergence.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(AnalysisError, match="no Dual Contextual layer"):
        dc_divergence.main(["--checkpoint", ckpts["std"], "--data", bin_dir, "--split", "valid", "--out",
                            str(tmp_path / "x"), "--cpu"])
