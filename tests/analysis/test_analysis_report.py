"""The one-page HTML report (fairseq_ext/analysis/report.py): every table and figure an
analysis wrote ends up on the page, escaped and inline, with the command that made it; a
failing analysis is shown as failed and the others still run; every analysis is given only
options its own parser accepts, and word_order compares each model with its counterpart."""
import base64
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from fairseq_ext.common import checkpoints
from fairseq_ext.analysis import AnalysisError, registry, report
from fairseq_ext.analysis import command as tables
from fairseq_ext.model_builder import parse_model_args
from fairseq_ext.models.multilayer_transformer_config import parse_options
from model_utils import clean_env, make_tiny_parallel_data, train_tiny

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _images(page: str):
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_collect_and_render_a_hand_made_analysis_directory(tmp_path):
    out = tmp_path / "a"
    tables.write_table([{"model": "<unk> & co", "BLEU": 12.3456, "p": 0.0004, "delta": None}], str(out), "t",
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
    with pytest.raises(AnalysisError, match="--run NAME"):
        report.main(["--out", str(tmp_path)])
    with pytest.raises(AnalysisError, match="--run needs --checkpoint and --data"):
        report.main(["--out", str(tmp_path), "--run", "attention_stats"])
    with pytest.raises(AnalysisError, match="--args 'nope=1'"):
        report.parse_extra(["nope=1"])
    # --from a folder that holds no analysis' output (empty, or a table that is not JSON): refused
    junk = tmp_path / "junk"
    junk.mkdir()
    for content in ({}, {"t.json": "not json", "t.md": "# t\n"}):
        for name, text in content.items():
            (junk / name).write_text(text)
        with pytest.raises(AnalysisError, match=f"--from {junk} holds no analysis output"):
            report.main(["--from", str(junk), "--out", str(tmp_path / "page")])
    assert not (tmp_path / "page").exists()
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


def test_each_analysis_runs_on_the_models_it_can_analyse(tmp_path, monkeypatch):
    """A report over a baseline, M-00, MS-1+AIF and MMA: layer masking runs on M-00 only, the
    auxiliary decoders and the AIF dependency on MS-1+AIF only, each page section naming the
    models left out and what they lack; attention statistics run on all four; an analysis no
    model can take is a failure on the page, and the others still run."""
    flags = {"base.pt": (),
             "m00.pt": ("--joint-attention", "m-00", "--joint-attention-layers", "3"),
             "ms.pt": ("--aux-decoder-layers", "1", "--aux-fusion"),
             "mma.pt": ("--encoder-attention-heads", "4", "--encoder-self-attention", "mma", "--mma-heads", "G,L,F,B")}
    # each model's typed options, as fairseq's parser and the model's own option parsing make them
    options = {c: parse_options(parse_model_args("multilayer_transformer", *f)) for c, f in flags.items()}
    monkeypatch.setattr(checkpoints, "options", lambda checkpoint: options[checkpoint])
    ran = []

    def run_analysis(argv, out):
        ran.append((argv[2].rsplit(".", 1)[1], argv[argv.index("--checkpoint") + 1:argv.index("--names")]))
        os.makedirs(out, exist_ok=True)
        return None
    monkeypatch.setattr(report, "run_analysis", run_analysis)
    code = report.main(["--run", "layer_dependency", "decoders", "aif_dependency", "dc_divergence", "attention_stats",
                        "--checkpoint", *options, "--names", "base", "M-00", "MS-1+AIF", "MMA", "--data", "bin",
                        "--out", str(tmp_path)])
    assert code == 1  # dc_divergence: no model has a Dual Contextual layer
    assert ran == [("layer_dependency", ["m00.pt"]), ("decoders", ["ms.pt"]), ("aif_dependency", ["ms.pt"]),
                   ("attention_stats", list(options))]
    page = (tmp_path / "report.html").read_text()
    assert "not run on base, MS-1+AIF, MMA: its decoder reads one encoder layer" in page
    assert "not run on base, M-00, MMA: it has no auxiliary decoder (--aux-decoder-layers)" in page
    assert "no model to analyse: not run on base, M-00, MS-1+AIF, MMA: its encoder has no Dual Contextual" in page


def test_the_page_says_what_each_model_is(tmp_path):
    """The models' table of the page, from each checkpoint: shape, technique, parameters (a
    tied embedding counted once: the model's own parameters()) and updates."""
    from types import SimpleNamespace

    from fairseq import checkpoint_utils

    from fairseq_ext.models.multilayer_transformer import MultilayerTransformerModel
    from model_utils import make_dictionary, write_checkpoint

    path = write_checkpoint(tmp_path / "m10-aif.pt", "--joint-attention", "m-10", "--aux-decoder-layers", "1",
                            "--aux-fusion")
    dictionary = make_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    task.build_model = lambda cfg, from_checkpoint=False: MultilayerTransformerModel.build_model(cfg, task)
    (model,), _ = checkpoint_utils.load_model_ensemble([path], task=task)
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    cfg = state["cfg"]["model"]
    about = checkpoints.describe_row(path)
    assert about["parameters"] == f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M"
    assert about["layers"] == f"{cfg.encoder_layers}+{cfg.decoder_layers}"
    assert about["d_model"] == str(cfg.encoder_embed_dim) and about["heads"] == str(cfg.encoder_attention_heads)
    assert "joint attention m-10" in about["technique"] and "with AIF" in about["technique"]
    assert about["updates"] == f"{state['optimizer_history'][-1]['num_updates']:,}"
    page = report.models_html([path], ["M-10+AIF"], "", "test")
    assert "<td>M-10+AIF</td>" in page and about["parameters"] in page


def test_a_page_of_earlier_analyses_describes_the_models_named_beside_them(tmp_path):
    from model_utils import write_checkpoint

    path = write_checkpoint(tmp_path / "s-agg.pt", "--joint-attention", "s-agg")
    earlier = tmp_path / "earlier"
    tables.write_table([{"model": "S-Agg", "BLEU": 1.0}], str(earlier), "t", "A table")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "prep.env").write_text("src=en\ntgt=de\ntest_set=t16\ntest_pairs=1000\ntrain_pairs=29000\n")
    assert report.main(["--from", str(earlier), "--checkpoint", path, "--names", "S-Agg", "--data",
                        str(tmp_path / "bin"), "--out", str(tmp_path / "page")]) == 0
    page = (tmp_path / "page" / "report.html").read_text()
    assert '<h2 id="models">The models</h2>' in page and "<td>S-Agg</td>" in page
    # an analysis of one model per directory is titled with its directory, as under --run
    single = tmp_path / "wt" / "MMA"
    tables.write_table([{"layer": 0, "encoder": 1.0}], str(single), "word_translation", "Accuracy")
    (single / "command.txt").write_text("python -m fairseq_ext.analysis.word_translation --out wt/MMA\n")
    assert report.main(["--from", str(single), "--out", str(tmp_path / "page2")]) == 0
    assert "Word-translation accuracy per layer: MMA</h2>" in (tmp_path / "page2" / "report.html").read_text()
    assert "test set t16 (1,000 sentences); 29,000 training pairs; en→de" in page


@pytest.mark.parametrize("name", list(registry.analyses()))
def test_every_analysis_parses_the_command_the_report_gives_it(name):
    """Each command the report builds is parsed by the analysis's own parser (argparse exits
    on an option it does not take), one name per checkpoint where it runs per checkpoint."""
    commands = report.analysis_commands(name, ["a.pt", "b.pt"], ["A", "B"], "bin", "valid", "o", True, [])
    parser = registry.get(name).parser()
    for argv, out in commands:
        args = parser.parse_args(argv[3:])
        assert args.data == "bin" and args.split == "valid" and args.out == out and args.cpu
        if registry.get(name).single:
            assert argv[argv.index("--names") + 1: argv.index("--out")] == [os.path.basename(out)]
    assert len(commands) == (2 if registry.get(name).single else 1)


def test_options_an_analysis_does_not_take_are_not_given(monkeypatch):
    """An analysis without --names or --cpu runs without them; one without --split is refused
    (it would analyse another split) and shown as failed while the others run."""
    accepted = {"--checkpoint", "--data", "--split", "--out", "--sentence"}
    monkeypatch.setattr(registry.Analysis, "option_strings", lambda self: accepted)
    (argv, out), _ = report.analysis_commands("attention_maps", ["a.pt", "b.pt"], ["A", "B"], "bin", "test", "o",
                                              True, ["--sentence", "2"])
    assert argv[3:] == ["--checkpoint", "a.pt", "--out", os.path.join("o", "attention_maps", "A"), "--data", "bin",
                        "--split", "test", "--sentence", "2"]
    accepted.discard("--split")
    with pytest.raises(AnalysisError, match="attention_maps takes no --split"):
        report.analysis_commands("attention_maps", ["a.pt"], ["A"], "bin", "test", "o", True, [])


@pytest.mark.slow
def test_report_runs_attention_maps_and_word_order_in_pairs(map_models, tmp_path):  # noqa: F811
    """attention_maps once per checkpoint and word_order on all of them, through the report,
    on lowercased data (prep.env lowercase=1): the model pairs with its counterpart without
    encoder positions, the MMA model is reported alone, and BLEU is lowercased BLEU."""
    bin_dir, ckpts = map_models
    data = tmp_path / "lowercased"
    shutil.copytree(bin_dir, data)
    (data / "prep.env").write_text("recipe=tiny\nsrc=src\ntgt=tgt\nbpe=none\nlowercase=1\n")
    out = tmp_path / "report"
    names = ["hier", "hier-nopos", "mma"]
    proc = subprocess.run([sys.executable, "-m", "fairseq_ext.analysis.report", "--checkpoint", ckpts["hier"],
                           ckpts["hier_nopos"], ckpts["mma"], "--names", *names, "--data", str(data), "--split",
                           "valid", "--cpu", "--out", str(out), "--run", "attention_maps", "word_order",
                           "--args", "attention_maps=--beam 2 --sentence 1",
                           "--args", "word_order=--samples 20 --generate-args '--beam 2 --max-len-b 8'"],
                          capture_output=True, text=True, env=clean_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'class="failed"' not in page
    images = _images(page)
    for name in names:  # each checkpoint's maps under its name, every figure on the page
        maps = out / "attention_maps" / name
        assert f"--names {name} " in (maps / "command.txt").read_text()
        assert json.loads((maps / "attention_maps.json").read_text())["name"] == name
        pngs = [p.read_bytes() for p in maps.glob("*.png")]
        assert len(pngs) >= 2 and all(p in images for p in pngs)
    rows = json.loads((out / "word_order" / "word_order.json").read_text())
    assert [(r["model"], r["encoder positions"], r["checkpoint"], r["note"]) for r in rows] == [
        ("hier", "sinusoidal", ckpts["hier"], ""), ("hier", "none", ckpts["hier_nopos"], ""),
        ("mma", "sinusoidal", ckpts["mma"], "alone: no counterpart without encoder positions")]
    assert rows[1]["delta"] == pytest.approx(rows[1]["BLEU"] - rows[0]["BLEU"], abs=1e-9) and rows[1]["p"] is not None
    assert rows[0]["delta"] is None and rows[2]["delta"] is None
    # lowercased data: the lowercased flavour, the score evaluation wrote for it
    assert {r["flavour"] for r in rows} == {"detok-lc"}
    scores = json.loads((out / "word_order" / "hier" / "nopos" / "bleu.json").read_text())
    assert scores["headline"] == "detok-lc" and rows[1]["BLEU"] == pytest.approx(scores["detok-lc"]["score"], abs=0.005)
    assert (out / "word_order" / "word_order.png").read_bytes() in images
    assert "alone: no counterpart without encoder positions" in page


@pytest.mark.slow
def test_report_runs_analyses_and_writes_one_self_contained_page(tmp_path):
    bin_dir = make_tiny_parallel_data(str(tmp_path), num_train=61)
    ckpt = train_tiny(bin_dir, tmp_path / "std", max_update=3, lr=None)
    out = tmp_path / "report"
    # attention_stats works on any encoder; dc_divergence has no model to analyse (no DC layer)
    proc = subprocess.run([sys.executable, "-m", "fairseq_ext.analysis.report", "--checkpoint", ckpt, "--names",
                           "std", "--data", bin_dir, "--split", "valid", "--cpu", "--out", str(out),
                           "--run", "attention_stats", "dc_divergence",
                           "--args", "attention_stats=--span all"], capture_output=True, text=True,
                          env=clean_env(), cwd=str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one analysis failed
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "no model to analyse: not run on std: its encoder has no Dual Contextual layer" in page
    assert 'class="failed"' in page
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
