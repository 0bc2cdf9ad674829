"""The one-page HTML report (fairseq_ext/analysis/report.py): every table and figure an
analysis wrote ends up on the page, escaped and inline, with the command that made it; a
failing analysis is shown as failed and the others still run."""
import base64
import json
import os
import re
import subprocess
import sys

import pytest

from fairseq_ext.analysis import common, report
from model_utils import clean_env, make_tiny_parallel_data, train_tiny

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _images(page: str):
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_collect_and_render_a_hand_made_analysis_directory(tmp_path):
    out = tmp_path / "a"
    common.write_table([{"model": "<unk> & co", "BLEU": 12.3456, "p": 0.0004, "delta": None}], str(out), "t",
                       "A <title>")
    png = PNG_MAGIC + b"not really an image, but the bytes must come back unchanged"
    (out / "sub").mkdir()
    (out / "sub" / "fig.png").write_bytes(png)
    (out / "broken.png").write_bytes(b"GIF89a")  # not a PNG: left out
    (out / "other.json").write_text("[1, 2]")  # no .md beside it: not a table
    (out / "command.txt").write_text("python -m fairseq_ext.analysis.attention_stats --out a\n")
    found = report.collect(str(out))
    assert [t["title"] for t in found["tables"]] == ["A <title>"]
    assert [f["name"] for f in found["figures"]] == [os.path.join("sub", "fig.png")]
    page = report.section_html("x", "T", "ref", str(out), found)
    assert "&lt;unk&gt; &amp; co" in page and "<unk>" not in page and "A &lt;title&gt;" in page
    assert "<td>12.35</td>" in page and "<td>0.0004</td>" in page and "<td>–</td>" in page
    assert _images(page) == [png]
    assert "python -m fairseq_ext.analysis.attention_stats --out a" in page


def test_errors_name_the_option(tmp_path):
    with pytest.raises(common.AnalysisError, match="--run NAME"):
        report.main(["--out", str(tmp_path)])
    with pytest.raises(common.AnalysisError, match="--run needs --checkpoint and --data"):
        report.main(["--out", str(tmp_path), "--run", "attention_stats"])
    with pytest.raises(common.AnalysisError, match="--args 'nope=1'"):
        report.parse_extra(["nope=1"])
    assert report.parse_extra(["attention_stats=--max-sentences 5", "attention_stats=--span all"]) == {
        "attention_stats": ["--max-sentences", "5", "--span", "all"]}


def test_single_checkpoint_analyses_run_once_per_checkpoint():
    cmds = report.analysis_commands("translate_from_layer", ["a.pt", "b.pt"], ["A", "B"], "bin", "test", "o",
                                    True, ["--beam", "2"])
    assert [out for _, out in cmds] == [os.path.join("o", "translate_from_layer", "A"),
                                        os.path.join("o", "translate_from_layer", "B")]
    argv, _ = cmds[1]
    assert argv[argv.index("--checkpoint") + 1] == "b.pt" and argv[-2:] == ["--beam", "2"] and "--cpu" in argv
    (argv, out), = report.analysis_commands("attention_stats", ["a.pt", "b.pt"], ["A", "B"], "bin", "test", "o",
                                            False, [])
    assert argv[argv.index("--checkpoint") + 1: argv.index("--checkpoint") + 3] == ["a.pt", "b.pt"]


@pytest.mark.slow
def test_report_runs_analyses_and_writes_one_self_contained_page(tmp_path):
    bin_dir = make_tiny_parallel_data(str(tmp_path), num_train=61)
    ckpt = train_tiny(bin_dir, tmp_path / "std", max_update=3, lr=None)
    out = tmp_path / "report"
    # attention_stats works on any encoder; dc_divergence refuses one without DC layers
    proc = subprocess.run([sys.executable, "-m", "fairseq_ext.analysis.report", "--checkpoint", ckpt, "--names",
                           "std", "--data", bin_dir, "--split", "valid", "--cpu", "--out", str(out),
                           "--run", "attention_stats", "dc_divergence",
                           "--args", "attention_stats=--span all"], capture_output=True, text=True,
                          env=clean_env(), cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one analysis failed
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "the encoder has no Dual Contextual layer" in page and 'class="failed"' in page
    # every table attention_stats wrote, with its numbers, and every figure, byte for byte
    per_layer = json.loads((out / "attention_stats" / "per_layer.json").read_text())
    assert len(per_layer) == 2 and f"{per_layer[0]['entropy']:.2f}" in page
    pngs = sorted(p.name for p in (out / "attention_stats").glob("*.png"))
    assert pngs == ["heatmaps_std.png", "layers.png"]
    images = _images(page)
    assert len(images) == 2 and all(i.startswith(PNG_MAGIC) for i in images)
    assert sorted(images) == sorted((out / "attention_stats" / n).read_bytes() for n in pngs)
    assert "fairseq_ext.analysis.attention_stats --checkpoint" in page and "--span all" in page
    assert "src=\"http" not in page and "<link" not in page  # nothing loaded from elsewhere
    # the analysis recorded its own command; --from builds a page from the directory alone
    assert "fairseq_ext.analysis.attention_stats" in (out / "attention_stats" / "command.txt").read_text()
    again = tmp_path / "again"
    assert report.main(["--from", str(out / "attention_stats"), "--out", str(again)]) == 0
    page2 = (again / "report.html").read_text(encoding="utf-8")
    assert "Encoder self-attention distance and entropy" in page2 and len(_images(page2)) == 2
