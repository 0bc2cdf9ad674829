"""scripts/benchmark.py at a tiny budget: the JSON it writes for the table runner and README,
and the deterministic numbers (FLOPs, activation and cache bytes) that must hold exactly:
the no-option model is the stock Transformer, MLMHA caches n layers' keys and values."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    # M-00 over the 4 layers of the small config: every decoder layer caches the keys and
    # values of 4 encoder layers instead of 1 (the self-attention cache is unchanged)
    stock_cache = data["stock"]["cache_bytes"]
    assert m00["cache_bytes"] > stock_cache and m00["train_flops_ratio"] > 1.0
    for key in ("train", "decode_beam1", "decode_beam"):
        r = m00[key]
        assert r["pairs"] == 3 and r["iqr"][0] <= r["ratio"] <= r["iqr"][1]
    assert "| M-00 |" in res.stdout
