"""AIF dependency (fairseq_ext/analysis/aif_dependency.py, thesis Sec. 4.5.5, Eq. 4.4-4.7):
every number against a direct computation from the two models' own outputs."""
import json
import math
import os

import pytest
import torch

from fairseq_ext.common import checkpoints
from fairseq_ext.analysis import AnalysisError, aif_dependency, capture
from model_utils import SMALL, build, make_tiny_parallel_data, random_batch, train_tiny

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
AIF = ("--aux-decoder-layers", "1", "--aux-fusion")


def aif_model(zero_aif=False):
    model, _ = build("multilayer_transformer", *SMALL, *AIF)
    if zero_aif:
        with torch.no_grad():
            for layer in model.decoder.layers:
                layer.aif.projections[0].weight.zero_()
    return model


def sample_of(model, bsz=3):
    src, lengths, _ = random_batch(model.decoder.dictionary, bsz=bsz)
    return {"id": torch.arange(bsz), "net_input": {"src_tokens": src, "src_lengths": lengths}}


def greedy_of_different_lengths(model, sample):
    """The main decoder's greedy output, cut to a different length per sentence (9, 7, 5
    tokens with EOS), so that the batch has padded target positions."""
    hyps = capture.translate(model, sample, max_len_b=8)
    eos = hyps[0].new_tensor([model.decoder.dictionary.eos()])
    return [torch.cat([h[: len(h) - 1 - 2 * b], eos]) for b, h in enumerate(hyps)]


def alone(model, src, pad, hyp, **kwargs):
    """Teacher-forced forward of one unpadded sentence on [EOS] + hyp[:-1]."""
    src = src[src.ne(pad)][None]
    prev = torch.cat([hyp[-1:], hyp[:-1]])[None]
    with torch.no_grad():
        return model(src, torch.tensor([src.size(1)]), prev, **kwargs)


def test_kl_divergence_of_hand_made_distributions():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]], dtype=torch.float64)
    q = torch.tensor([[0.25, 0.75, 0.0], [0.1, 0.2, 0.7]], dtype=torch.float64)
    got = aif_dependency.kl_divergence(torch.log(p), torch.log(q))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # the 0 log 0 term counts 0
    assert got.dtype == torch.float64
    assert got[0].item() == pytest.approx(expected, abs=1e-12) and got[1].item() == 0.0
    # KL is not symmetric, and a q with zero mass where p has some is infinitely far
    assert aif_dependency.kl_divergence(torch.log(q[0]), torch.log(p[0])).item() == pytest.approx(
        0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5), abs=1e-12)
    assert math.isinf(aif_dependency.kl_divergence(torch.log(torch.tensor([0.5, 0.5])),
                                                   torch.log(torch.tensor([1.0, 0.0]))).item())
    # from float32 log-probabilities the sum is still taken in float64
    assert aif_dependency.kl_divergence(torch.log(p.float()), torch.log(q.float()))[0].item() == pytest.approx(
        expected, abs=1e-6)


def test_ind_decoder_is_a_copy_with_zero_aif_weights():
    model = aif_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ind = aif_dependency.ind_decoder(model)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)  # the model itself is untouched
        w = ind.state_dict()[k]
        if ".aif." in k:
            assert v.abs().sum() > 0 and torch.count_nonzero(w) == 0
        else:
            torch.testing.assert_close(w, v, rtol=0, atol=0)
    assert any(".aif." in k for k in before) and ind.decoder.layers[0].aif is not model.decoder.layers[0].aif


@pytest.mark.parametrize("flags", [(), ("--aux-decoder-layers", "1")], ids=["no-aux", "aux-without-fusion"])
def test_a_model_without_aif_is_refused(flags):
    model, _ = build("multilayer_transformer", *SMALL, *flags)
    with pytest.raises(AnalysisError, match="--aux-fusion"):
        aif_dependency.ind_decoder(model)


def test_token_and_sentence_divergences_equal_a_direct_computation():
    """Eq. 4.4-4.5 recomputed from each sentence alone (no padding): the main decoder's and a
    separately built ind-decoder's log-probabilities on the main decoder's greedy output."""
    model = aif_model()
    ind = aif_model(zero_aif=True)  # same seed: the same weights except W^a
    sample = sample_of(model)
    hyps = greedy_of_different_lengths(model, sample)
    assert len({len(h) for h in hyps}) == len(hyps)
    results = aif_dependency.compare(model, aif_dependency.ind_decoder(model), sample, hyps)
    pad = model.decoder.dictionary.pad()
    for b, r in enumerate(results):
        hyp = hyps[b]
        assert r["id"] == b and torch.equal(r["tokens"], hyp) and r["D_yt"].shape == (len(hyp),)
        lp_m = model.get_normalized_probs(alone(model, sample["net_input"]["src_tokens"][b], pad, hyp),
                                          log_probs=True)[0].double()
        lp_i = ind.get_normalized_probs(alone(ind, sample["net_input"]["src_tokens"][b], pad, hyp),
                                        log_probs=True)[0].double()
        # P_m is the distribution the greedy search took y_t from (EOS is banned at step 0, and
        # ends the cut hypotheses)
        assert torch.equal(lp_m.argmax(-1)[1:-1], hyp[1:-1])
        expected = (lp_m.exp() * (lp_m - lp_i)).sum(-1)
        torch.testing.assert_close(r["D_yt"], expected, atol=1e-5, rtol=1e-4)
        assert r["D_Y"] == pytest.approx(expected.mean().item(), abs=1e-5) and r["D_Y"] > 0


def test_cross_attention_divergence_equals_a_direct_computation():
    """Eq. 4.6-4.7 for the last decoder layer, each head's weights taken from fairseq's own
    alignment output (extra["attn"], the mean of the first k heads: head k = k mean_k -
    (k-1) mean_{k-1}), rows averaged (and summed with --attention-rows sum)."""
    model = aif_model()
    ind = aif_model(zero_aif=True)
    sample = sample_of(model)
    hyps = greedy_of_different_lengths(model, sample)
    means = aif_dependency.compare(model, aif_dependency.ind_decoder(model), sample, hyps)
    sums = aif_dependency.compare(model, aif_dependency.ind_decoder(model), sample, hyps, rows="sum")
    pad, layer = model.decoder.dictionary.pad(), len(model.decoder.layers) - 1
    heads = model.decoder.layers[layer].encoder_attn.num_heads
    for b, hyp in enumerate(hyps):
        src = sample["net_input"]["src_tokens"][b]
        weights = []
        for m in (model, ind):
            mean_k = [alone(m, src, pad, hyp, alignment_layer=layer, alignment_heads=k)[1]["attn"][0][0].double()
                      for k in range(1, heads + 1)]  # Z x J each
            weights.append([mean_k[0]] + [(k + 1) * mean_k[k] - k * mean_k[k - 1] for k in range(1, heads)])
        for h in range(heads):
            a_m, a_i = weights[0][h], weights[1][h]
            torch.testing.assert_close(a_m.sum(-1), torch.ones(len(hyp), dtype=torch.float64))
            rows = (a_m * (torch.log(a_m) - torch.log(a_i))).sum(-1)  # KL of each query row
            assert means[b]["attention"][layer, h].item() == pytest.approx(rows.mean().item(), abs=1e-5)
            assert sums[b]["attention"][layer, h].item() == pytest.approx(rows.sum().item(), abs=1e-4)
        assert means[b]["attention"].shape == (len(model.decoder.layers), heads)
        assert (means[b]["attention"] > 0).all()


def test_zero_aif_weights_give_zero_dependency():
    model = aif_model(zero_aif=True)
    sample = sample_of(model)
    results = aif_dependency.compare(model, aif_dependency.ind_decoder(model), sample,
                                     capture.translate(model, sample, max_len_b=8))
    for r in results:
        assert torch.count_nonzero(r["D_yt"]) == 0 and r["D_Y"] == 0.0
        assert torch.count_nonzero(r["attention"]) == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny MS-1+AIF checkpoint (6 updates) and a copy with its AIF weights zeroed."""
    root = tmp_path_factory.mktemp("aif")
    bin_dir = make_tiny_parallel_data(str(root), num_train=121)
    ckpt = train_tiny(bin_dir, root / "aif", *AIF, "--criterion", "multi_output_label_smoothed_cross_entropy")
    state = torch.load(ckpt, weights_only=True)  # the file as saved (the plugin allowlists its contents)
    zeroed = [k for k in state["model"] if ".aif." in k]
    assert zeroed
    for k in zeroed:
        state["model"][k] = torch.zeros_like(state["model"][k])
    os.makedirs(root / "zeroed")
    torch.save(state, root / "zeroed" / "checkpoint_last.pt")
    return bin_dir, ckpt, str(root / "zeroed" / "checkpoint_last.pt")


@pytest.mark.slow
def test_command_end_to_end(trained, tmp_path):
    bin_dir, ckpt, zeroed = trained
    out = tmp_path / "out"
    aif_dependency.main(["--checkpoint", ckpt, zeroed, "--names", "aif", "zeroed", "--data", bin_dir,
                         "--split", "test", "--out", str(out), "--cpu", "--max-sentences", "5",
                         "--sentence", "7", "--max-len-b", "12"])
    for name in ("summary", "per_sentence", "per_head", "tokens"):
        assert (out / f"{name}.md").exists() and (out / f"{name}.csv").exists()
    summary = json.loads((out / "summary.json").read_text())
    per_sentence = json.loads((out / "per_sentence.json").read_text())
    per_head = json.loads((out / "per_head.json").read_text())
    tokens = json.loads((out / "tokens.json").read_text())
    assert [s["model"] for s in summary] == ["aif", "zeroed"] and summary[0]["sentences"] == 5
    aif, zero = summary
    assert aif["mean D_Y"] > 0 and aif["D^1"] > 0 and aif["D^2"] > 0
    assert zero["mean D_Y"] == 0 and zero["D^1"] == 0 and zero["D^2"] == 0
    # mean D_Y over the set, D^l the mean of its heads (Eq. 4.7), the overall mean of the layers
    assert [r["id"] for r in per_sentence if r["model"] == "aif"] == [0, 1, 2, 3, 4]
    assert aif["mean D_Y"] == pytest.approx(sum(r["D_Y"] for r in per_sentence[:5]) / 5, rel=1e-9)
    for layer in (1, 2):
        heads = [r["D^l_h"] for r in per_head if r["model"] == "aif" and r["layer"] == layer]
        assert len(heads) == 2 and aif[f"D^{layer}"] == pytest.approx(sum(heads) / 2, rel=1e-9)
    assert aif["mean D^l"] == pytest.approx((aif["D^1"] + aif["D^2"]) / 2, rel=1e-9)
    # sentence 7 (outside the analysed 5) decoded alone equals its values within a batch
    model, task = checkpoints.load_model(ckpt, bin_dir, split="test", cpu=True)
    batch = aif_dependency.analyse(model, task, "test", max_sentences=8, max_len_b=12, cpu=True)[7]
    got = [r for r in tokens if r["model"] == "aif"]
    assert [r["sentence"] for r in got] == [7] * len(batch["tokens"])
    assert [r["token"] for r in got] == [task.target_dictionary[int(t)] for t in batch["tokens"]]
    assert got[-1]["token"] == "</s>"
    assert got[0]["source"] == task.source_dictionary.string(task.dataset("test").src[7])
    torch.testing.assert_close(torch.tensor([r["D_yt"] for r in got], dtype=torch.float64), batch["D_yt"],
                               atol=1e-5, rtol=1e-4)
    assert all(r["D_yt"] == 0 for r in tokens if r["model"] == "zeroed")
    for png in ("aif_dependency.png", "tokens.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
    fig = aif_dependency.plot_dependency(summary, per_sentence, per_head, str(tmp_path / "a.png"))
    assert len(fig.axes) == 2  # Fig. 4.7a and 4.7b
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["aif", "zeroed"]  # one box per model
    assert len(fig.axes[1].lines) == 2 and list(fig.axes[1].lines[0].get_xdata()) == [1, 2]  # D^l per model
    assert [len(c.get_offsets()) for c in fig.axes[1].collections] == [4, 4]  # D^l_h: 2 layers x 2 heads
    fig = aif_dependency.plot_tokens(tokens, str(tmp_path / "t.png"))
    assert len(fig.axes) == 2  # Fig. 4.8: one panel per model
    assert len(fig.axes[0].patches) == len(got)
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [r["token"] for r in got]
