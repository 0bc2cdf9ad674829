"""scripts/benchmark.py at a tiny budget: the JSON it writes for the table runner and README,
and the deterministic numbers (FLOPs, activation and cache bytes) that must hold exactly:
the no-option model is the stock Transformer, MLMHA caches n layers' keys and values."""
import json
import os
import subprocess
import sys

import pytest
import torch

from model_utils import REPO


def test_benchmark_smoke_and_deterministic_ratios(tmp_path):
    out = tmp_path / "bench.json"
    res = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "benchmark.py"), "--configs", "no option:",
                          "M-00:--joint-attention m-00", "--batch", "2", "--steps", "3", "--min-pairs", "3",
                          "--max-pairs", "3", "--seconds", "1", "--threads", "1", "--vocab", "500", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    plain, m00 = data["configs"]
    # the same arithmetic and memory as fairseq's own Transformer
    assert plain["train_flops_ratio"] == 1.0 and plain["decode_flops_ratio"] == 1.0
    assert plain["activation_ratio"] == 1.0 and plain["cache_ratio"] == 1.0
    assert plain["params"] == data["stock"]["params"]
    assert plain["train_ops_ratio"] == plain["step_ops_ratio"] == 1.0  # the same operators, too
    assert m00["train_ops_ratio"] > 1.0 and m00["step_ops_ratio"] > 1.0  # and M-00 attends 4 layers
    # M-00 over the 4 layers of the small config: every decoder layer caches the keys and
    # values of 4 encoder layers instead of 1, once per sentence instead of per hypothesis
    # (the self-attention cache is unchanged)
    # (at beam 4 these per-sentence keys/values weigh what the stock's per-hypothesis ones do)
    assert 0.8 < m00["cache_ratio"] < 1.2 and m00["train_flops_ratio"] > 1.0
    for key in ("train", "decode_beam1", "decode_beam", "generate_beam"):
        r = m00[key]
        assert r["pairs"] == 3 and r["iqr"][0] <= r["ratio"] <= r["iqr"][1]
    assert "| M-00 |" in res.stdout


def test_benchmark_runs_in_bf16_and_refuses_cpu_fp16(tmp_path):
    """The half-precision path the GPU runs (--dtype fp16/bf16 casts both models) is the same
    code on a CPU in bf16; fp16 on a CPU would time torch's reference kernels, so it is refused
    with a message that names the option."""
    script = os.path.join(REPO, "scripts", "benchmark.py")
    out = tmp_path / "bf16.json"
    res = subprocess.run([sys.executable, script, "--config", "tiny",
                          "--configs", "MS-1+AIF:--aux-decoder-layers 1 --aux-fusion",
                          "Dec-DC:--decoder-self-attention dc", "--batch", "3", "--steps", "3", "--min-pairs", "3",
                          "--max-pairs", "3", "--seconds", "1", "--threads", "1", "--vocab", "500", "--dtype", "bf16",
                          "--device", "cpu", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["settings"]["dtype"] == "bf16" and ", bf16, " in res.stdout
    aif, dc = data["configs"]
    # the same deterministic arithmetic as in fp32: one auxiliary decoder adds its self-attention's
    # cache (the steps so far) and its cross-attention's keys and values, once per sentence
    assert 1.0 < aif["cache_ratio"] < 2.0 and dc["train_flops_ratio"] > 1.0
    for rec in (aif, dc):
        assert all(rec[key]["pairs"] == 3 for key in ("train", "decode_beam1", "decode_beam", "generate_beam"))
    res = subprocess.run([sys.executable, script, "--dtype", "fp16", "--device", "cpu"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 2 and "--dtype fp16 needs --device cuda" in res.stderr


# ---- memory: the incremental cache of every technique against its formula ----------------

D, HEADS, ENC, DEC = 32, 4, 4, 2
TINY = ["--encoder-layers", str(ENC), "--decoder-layers", str(DEC), "--encoder-embed-dim", str(D),
        "--decoder-embed-dim", str(D), "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", str(HEADS), "--decoder-attention-heads", str(HEADS)]


def _cache_floats(state) -> int:
    total, seen = 0, set()
    for buffer in state.values():
        for value in (buffer.values() if isinstance(buffer, dict) else []):
            if torch.is_tensor(value) and value.is_floating_point() and value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.numel()
    return total


def _decode(model, src, lengths, beam, steps):
    """The cache after ``steps`` incremental steps of len(src) x beam hypotheses."""
    tokens = torch.randint(4, 100, (src.size(0) * beam, steps), generator=torch.Generator().manual_seed(0))
    order = torch.arange(src.size(0)).repeat_interleave(beam)
    state = {}
    with torch.no_grad():
        enc = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths), order)
        for t in range(steps):
            logits, _ = model.decoder(tokens[:, : t + 1], encoder_out=enc, incremental_state=state)
            assert torch.isfinite(logits).all()
    return state


# README "Performance", memory: floats cached per hypothesis and decoder layer after t steps,
# with J source tokens, n = the collected layers (here all ENC), d the model width, f the DC
# kernel, k auxiliary decoders. fairseq's stock cross-attention also keeps its padding mask
# as J floats. SENTENCE: what the cross-attentions over n stacked sources cache once per
# sentence (its beam shares one row of projected keys/values), per decoder layer.
N = ENC
SENTENCE = {
    "m-00": lambda J: 2 * N * J * D,  # K^i and V^i of every layer
    "m-10": lambda J: 2 * N * J * D,
    "m-11": lambda J: 2 * N * J * D,
    "m-01": lambda J: (N + 1) * J * D,  # K^i of every layer and sum_i V^i
    "flat": lambda J: 2 * N * J * D,
    "hierarchical": lambda J: 2 * N * J * D,  # each first-level attention's K^i and V^i
    "transparent": lambda J: 2 * J * D,  # the layer's own mix of the J states, through its K and V
    "serial": lambda J: 2 * N * J * D,  # each sublayer's K^i and V^i
    "ms-1,3+aif": lambda J: 2 * 2 * J * D,  # each auxiliary decoder's K and V of its encoder layer
}
CACHE_FORMULA = {
    "no option": lambda t, J: 2 * t * D + 2 * J * D + J,
    "s-agg": lambda t, J: 2 * t * D + 2 * J * D + J,  # one aggregated memory, like the stock model
    "transparent": lambda t, J: 2 * t * D,  # + SENTENCE
    "m-00": lambda t, J: 2 * t * D,  # + SENTENCE
    "m-10": lambda t, J: 2 * t * D,
    "m-11": lambda t, J: 2 * t * D,
    "m-01": lambda t, J: 2 * t * D,
    "flat": lambda t, J: 2 * t * D,
    "hierarchical": lambda t, J: 2 * t * D,  # + SENTENCE: the n first-level attentions decode together
    "serial": lambda t, J: 2 * t * D,  # + SENTENCE
    "parallel": lambda t, J: 2 * t * D + N * (2 * J * D + J),
    "ms-1": lambda t, J: 2 * t * D + 2 * J * D + J,  # auxiliary decoders do not decode
    # they decode in lock-step with AIF, their cross-attentions' keys and values once per sentence (+ SENTENCE)
    "ms-1,3+aif": lambda t, J: 3 * 2 * t * D + 2 * J * D + J,
    "dec-dc f=2": lambda t, J: 4 * t * D + 1 * D + 2 * J * D + J,  # both FI units' K, V; f - 1 conv inputs
    "dec-dc f=3": lambda t, J: 4 * t * D + 2 * D + 2 * J * D + J,
    "dec-mma": lambda t, J: 2 * t * D + 2 * J * D + J,
}
CACHE_FLAGS = {
    "no option": [], "s-agg": ["--joint-attention", "s-agg"], "transparent": ["--joint-attention", "transparent"],
    "m-00": ["--joint-attention", "m-00"], "m-10": ["--joint-attention", "m-10"],
    "m-11": ["--joint-attention", "m-11"], "m-01": ["--joint-attention", "m-01"],
    "flat": ["--joint-attention", "flat"],
    "hierarchical": ["--joint-attention", "hierarchical"], "serial": ["--joint-attention", "serial"],
    "parallel": ["--joint-attention", "parallel"], "ms-1": ["--aux-decoder-layers", "1"],
    "ms-1,3+aif": ["--aux-decoder-layers", "1,3", "--aux-fusion"],
    "dec-dc f=2": ["--decoder-self-attention", "dc", "--dc-kernel-size", "2"],
    "dec-dc f=3": ["--decoder-self-attention", "dc", "--dc-kernel-size", "3"],
    "dec-mma": ["--decoder-self-attention", "mma"],
}


@pytest.mark.parametrize("name", list(CACHE_FORMULA))
def test_incremental_cache_is_what_the_formula_says(name):
    from fairseq_ext.model_builder import build_model, make_dictionary

    model, _ = build_model("multilayer_transformer", *TINY, *CACHE_FLAGS[name], dictionary=make_dictionary(200))
    bsz, beam, J = 3, 2, 7
    src = torch.randint(4, 200, (bsz, J), generator=torch.Generator().manual_seed(1))
    lengths = torch.full((bsz,), J)
    per_sentence = SENTENCE.get(name, lambda J: 0)(J)
    for t in (3, 6):
        state = _decode(model, src, lengths, beam, t)
        assert _cache_floats(state) == bsz * DEC * (beam * CACHE_FORMULA[name](t, J) + per_sentence), t


@pytest.mark.slow
def test_a_1000_token_source_through_every_strategy():
    """Training step and 4 decoding steps with a 1,000-token source (batch 1) for every joint
    attention strategy and self-attention variant, at the small preset's width; the cache is
    the formula's size (a strategy that kept something per step and length would not be)."""
    import resource

    from fairseq_ext.model_builder import build_model, make_dictionary
    from fairseq_ext.models.joint_attention_strategies import STRATEGIES

    dictionary = make_dictionary(200)
    J = 1000
    src = torch.randint(4, 200, (1, J), generator=torch.Generator().manual_seed(2))
    src[0, -1] = dictionary.eos()
    lengths = torch.tensor([J])
    prev = torch.randint(4, 200, (1, 12))
    variants = [["--joint-attention", s] for s in STRATEGIES if s != "none"]
    variants += [["--encoder-self-attention", "dc"], ["--encoder-self-attention", "mma"],
                 ["--decoder-self-attention", "dc"], ["--aux-decoder-layers", "1,3", "--aux-fusion"]]
    for flags in variants:
        model, _ = build_model("multilayer_transformer_iwslt", "--encoder-layers", "4", "--decoder-layers", "2",
                               "--max-source-positions", "1024", *flags, dictionary=dictionary)
        model.train()
        out, _ = model(src, lengths, prev)
        out.float().logsumexp(-1).mean().backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), flags
        model.eval()
        state = _decode(model, src, lengths, 1, 4)
        floats = _cache_floats(state)
        d = model.decoder.embed_dim
        assert 2 * J * d * 2 <= floats <= 2 * J * d * 2 * 5 + 4 * J * 2, (flags, floats)
        del model, state, out
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    assert peak_gib < 8, peak_gib


def test_benchmark_profile_prints_where_the_time_goes():
    res = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "benchmark.py"), "--profile", "decode",
                          "--configs", "M-00:--joint-attention m-00", "--batch", "2", "--steps", "3", "--threads", "1",
                          "--vocab", "500"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("Self CPU time total") == 2
    assert "## stock: one decoding run (beam 4)" in res.stdout and "## M-00:" in res.stdout
    assert "aten::bmm" in res.stdout or "aten::matmul" in res.stdout


def test_no_option_adds_a_host_sync():
    """On a GPU every .item(), bool() of a tensor, .tolist() and .cpu() stops the host until the
    device catches up. A training step (forward and backward) and one incremental decoding step of
    every option set make no more of them than stock fairseq's own model, once per decoder (an
    auxiliary decoder repeats its decoder's); operators are counted too, beside the FLOPs."""
    from fairseq_ext.selfcheck.benchmark import decode_fn, train_step_fn
    from fairseq_ext.selfcheck.timing import dispatch_counts
    from joint_attention_reference import OPTION_SETS
    from model_utils import SMALL, build, build_stock, make_dictionary, random_batch

    dictionary = make_dictionary(300)
    batch = random_batch(dictionary)

    def counts(model):
        decode_fn(model, batch, 4, 1)()  # weights concatenated once for decoding are not a step's
        one, two = (dispatch_counts(decode_fn(model, batch, 4, n)) for n in (1, 2))
        return dispatch_counts(train_step_fn(model, batch)), (two[0] - one[0], two[1] - one[1])

    stock, _ = build_stock("transformer_iwslt_de_en", *SMALL, dictionary=dictionary, seed=1)
    (stock_ops, stock_train), (stock_step_ops, stock_step) = counts(stock)
    assert stock_train > 0 and stock_step > 0  # the counter sees fairseq's own (padding checks)
    for name, flags in sorted(OPTION_SETS.items()):
        model, _ = build("multilayer_transformer_iwslt", *SMALL, *flags, dictionary=dictionary, seed=1)
        (ops, train), (step_ops, step) = counts(model)
        decoders = 1 + len(getattr(model.decoder, "aux_decoders", None) or [])
        assert train <= decoders * stock_train and step <= decoders * stock_step, (name, train, step)
        assert ops > 0.9 * stock_ops and step_ops > 0.5 * stock_step_ops, name  # the counter sees them
    plain = build("multilayer_transformer_iwslt", *SMALL, dictionary=dictionary, seed=1)[0]
    (ops, train), step = counts(plain)  # no option: stock's syncs and decoding step, its training within 3 ops
    assert train == stock_train and step == (stock_step_ops, stock_step) and 0 <= ops - stock_ops <= 3
