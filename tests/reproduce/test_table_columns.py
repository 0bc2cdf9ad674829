"""The table runner's columns: every printed column of a table next to ours, against the
row's own reference row, with the scale of our runs on the page; the analyses a table's
columns read; the files a run writes (a subset or a failed run never replaces a complete
table); the LaTeX export; the checks of the table configs.

Runs here are hand-made run directories (result.json, eval-test/, analysis outputs) read by
``fairseq-ext reproduce --report`` and the report functions; (slow) one analysis table runs
end to end at a tiny budget."""
import json
import os
import random
import re
import shutil
import subprocess
import types

import pytest
import yaml

from fairseq_ext.reproduce import __main__ as cli
from fairseq_ext.reproduce import execute, planning
from fairseq_ext.reproduce.planning import plan_analyses
from fairseq_ext.reproduce.readers import scales
from fairseq_ext.reproduce.render import latex, latex_escape
from fairseq_ext.reproduce.rows import build_rows
from fairseq_ext.reproduce.tables import TableConfigError, load_setups, load_table
from fairseq_ext.resources import TABLE_DIR
from model_utils import MULTI30K, REPO
from reproduce_utils import PREP_ENV, SMOKE_MODEL, report_cli

def make_runs(tmp_path, table_id, results, rows=None, datasets=None, budget="60", analyses=None, samples=1000):
    """Finished runs of ``table_id`` at smoke scale: result.json from ``results`` (row -> dict),
    the analysis outputs ``analyses`` ((row, analysis) -> {file: content}) each with the marker
    of its planned command, a prep.env of the data. Returns (table, rows, plans, analysis plans, options)."""
    table = load_table(table_id)
    setups = load_setups()
    opts = planning.Options(work_dir=str(tmp_path / "runs"), data_root=str(tmp_path / "data"), smoke=True,
                            budget=budget, cpu=True)
    selected = table.select(rows)
    plans = planning.plan_table(table, selected, setups, opts, datasets)
    aps = plan_analyses(table, plans, setups, opts, samples)
    for p in plans:
        os.makedirs(p.run_dir, exist_ok=True)
        os.makedirs(p.data_dir, exist_ok=True)
        with open(os.path.join(p.data_dir, "prep.env"), "w") as f:
            f.write(PREP_ENV)
        if p.row in results:
            with open(os.path.join(p.run_dir, "result.json"), "w") as f:
                json.dump({"plan": p.result_key(), "model": SMOKE_MODEL, "updates": 60, "planned_updates": 60,
                           **results[p.row]}, f)
    for a in aps:
        files = (analyses or {}).get((a.run.row, a.name))
        if files is None:
            continue
        os.makedirs(a.out, exist_ok=True)
        for name, content in files.items():
            with open(os.path.join(a.out, name), "w") as f:
                json.dump(content, f)
        with open(os.path.join(a.out, planning.ANALYSIS_DONE), "w") as f:
            json.dump({"command": a.command}, f)
    return table, selected, plans, aps, opts


# ---- the right paper column, against the right row -------------------------------------

def test_wt2_shows_the_papers_bleu_beside_ours_not_bleu1(tmp_path, capsys):
    """wt-2: BLEU and BLEU1 from translate_from_layer of the one model all rows report on; the
    paper's BLEU column is BLEU (7.92 for layer 0), not the unigram BLEU1 (33.1); the printed
    deltas are against the layer below, ours too."""
    ours = [{"layer": l, "BLEU-1": 30.0 + 1.5 * l, "BLEU": 5.0 + 0.75 * l} for l in range(7)]
    ours.append({"layer": "FULL", "BLEU-1": 55.5, "BLEU": 21.25})
    make_runs(tmp_path, "wt-2", {"layer-0": {"bleu": 20.0, "params": 1_400_000}},
              analyses={("layer-0", "translate_from_layer"): {"translate_from_layer.json": ours}})
    assert report_cli(tmp_path, "wt-2", "--budget", "60") == 0
    out = capsys.readouterr().out
    with open(tmp_path / "runs" / "wt-2" / "table.smoke.60.json") as f:  # every row: the complete table
        records = {r["row"]: r for r in json.load(f)["rows"]}
    bleu = records["layer-0"]["columns"]["BLEU (BPE, case-insensitive)"]
    assert bleu["paper_value"] == pytest.approx(7.92) and bleu["ours"] == pytest.approx(5.0)
    assert records["layer-0"]["columns"]["BLEU1 (BPE, case-insensitive)"]["paper_value"] == pytest.approx(33.1)
    layer3 = records["layer-3"]["columns"]
    assert layer3["BLEU Δ"]["paper"] == "0.84" and layer3["BLEU Δ"]["ours"] == pytest.approx(0.75)
    full = records["full"]["columns"]
    assert full["BLEU (BPE, case-insensitive)"]["ours"] == pytest.approx(21.25)
    assert full["BLEU Δ"]["ours"] == pytest.approx(21.25 - (5.0 + 0.75 * 6))  # FULL against layer 6
    assert records["full"]["reference"] == "layer-6" and records["full"]["model_row"] == "layer-0"
    assert "| Layer 0 | – | 33.1 | 30.00 | – | – | 7.92 | 5.00 | – | – |" in out
    assert "| FULL | Layer 6 | 62.0 | 55.50 | 13.4 | +16.50 | 33.26 | 21.25 | 19.81 | +11.75 |" in out


def _sentences(rng, n, vocab):
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 11))) for _ in range(n)]


def _noisy(rng, refs, keep):
    out = []
    for ref in refs:
        words = [w if rng.random() < keep else "x" for w in ref.split()]
        out.append(" ".join(words))
    return out


def test_mma3_compares_the_mma_row_without_positions_with_the_transformer_without(tmp_path, capsys):
    """mma-3: "MMA - Position Embedding" is compared with "Transformer - Position Embedding"
    (the paper's Δ +18.11), its Δ and its paired bootstrap too; the bootstrap's p is
    sacreBLEU's for exactly these two systems."""
    from fairseq_ext.tools.significance import paired_significance
    from fairseq_ext.tools.statistics import bleu_metric

    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(60)]
    refs = _sentences(rng, 37, vocab)
    keep = {"transformer": 0.8, "transformer-position-embedding": 0.45, "transformer-mma": 0.82,
            "transformer-mma-position-embedding": 0.7}
    hyps = {row: _noisy(rng, refs, k) for row, k in keep.items()}
    bleu = {row: bleu_metric("tok-lc").corpus_score(h, [refs]).score for row, h in hyps.items()}
    table, rows, plans, _, _ = make_runs(tmp_path, "mma-3", {r: {"bleu": b} for r, b in bleu.items()},
                                         datasets=["iwslt14-de-en"])
    for p in plans:
        os.makedirs(os.path.join(p.run_dir, "eval-test"))
        for name, lines in (("hyp.tok", hyps[p.row]), ("ref.tok", refs)):
            with open(os.path.join(p.run_dir, "eval-test", name), "w") as f:
                f.writelines(line + "\n" for line in lines)
    assert report_cli(tmp_path, "mma-3", "--datasets", "iwslt14-de-en", "--samples", "200", "--budget", "60") == 0
    out = capsys.readouterr().out
    mma_pe = next(p for p in plans if p.row == "transformer-mma-position-embedding")
    with open(os.path.join(mma_pe.run_dir, "significance.json")) as f:
        sig = json.load(f)
    expected = paired_significance(refs, hyps["transformer-position-embedding"],
                                   {"x": hyps["transformer-mma-position-embedding"]}, flavour="tok-lc",
                                   n_samples=200, seed=12345, marks="mma")["x"]
    assert sig["baseline"] == "transformer-position-embedding" and sig["p_value"] == expected["p_value"]
    with open(tmp_path / "runs" / "mma-3" / "table.smoke.60.datasets-iwslt14-de-en.json") as f:
        records = {r["row"]: r for r in json.load(f)["rows"]}
    rec = records["transformer-mma-position-embedding"]
    delta = rec["columns"]["Δ"]
    assert rec["reference"] == "transformer-position-embedding" and delta["paper"] == "+ 18.11"
    assert delta["ours"] == pytest.approx(bleu["transformer-mma-position-embedding"]
                                          - bleu["transformer-position-embedding"])
    assert records["transformer-mma"]["reference"] == "transformer"
    assert records["transformer-mma"]["columns"]["Δ"]["ours"] == pytest.approx(bleu["transformer-mma"]
                                                                             - bleu["transformer"])
    line = next(l for l in out.splitlines() if l.startswith("| Transformer MMA - Position Embedding |"))
    assert "| Transformer - Position Embedding | 34.66 |" in line and "| +18.11 | " \
        f"{delta['ours']:+.2f} |" in line


# ---- analysis tables ---------------------------------------------------------------------

def test_thesis_35_shows_the_masked_layer_drops_beside_ours_at_smoke_scale(tmp_path, capsys):
    masking = [{"model": "m-00", "masked layer": "none", "BLEU": 20.5, "delta": None, "p": None, "mark": ""}]
    masking += [{"model": "m-00", "masked layer": f"f^{i}", "BLEU": 20.5 - i, "delta": -float(i),
                 "p": 0.001 if i > 2 else 0.3, "mark": "‡" if i > 2 else ""} for i in range(1, 7)]
    make_runs(tmp_path, "thesis-3.5", {"m-00": {"bleu": 20.5, "params": 1_422_976}}, rows="m-00",
              analyses={("m-00", "layer_dependency"): {"masking.json": masking}})
    assert report_cli(tmp_path, "thesis-3.5", "--rows", "m-00", "--budget", "60") == 0
    out = capsys.readouterr().out
    assert ("| M-00 | -15.25‡ | -1.00 |  p=0.300 | -0.49† | -2.00 |  p=0.300 | -0.27 | -3.00 | ‡ p=0.001 | 0.03 | "
            "-4.00 | ‡ p=0.001 | -1.79‡ | -5.00 | ‡ p=0.001 | -9.85‡ | -6.00 | ‡ p=0.001 | 20.50 |") in out
    # a column no paper prints has no "paper" sub-column: its name heads ours
    assert "| BLEU (full model) [not in the paper's table]: ours |" in out
    # the scale, on the page
    for said in ("ours: multi30k-en-de, a substitute (multi30k-en-de in place of wmt14-en-de (--smoke)); test set "
                 "test_2016_flickr, 1,000 test sentences; 3,000 training pairs (the --smoke cut)",
                 "model: 6+6 layers, d_model 64, FFN 128, 4 heads; 1.42M parameters",
                 "training: 60 updates per row (60 of 60 updates done), CPU, seed 1",
                 "decoding: --beam 2 --max-len-a 1.2 --max-len-b 10; BLEU detok-cased",
                 "smoke scale: a check that every step runs", "sig. (pipeline check)",
                 "At smoke scale this is a check that the test runs, not evidence"):
        assert said in out, said
    path = tmp_path / "runs" / "thesis-3.5" / "table.smoke.60.rows-m-00.md"
    assert path.read_text().startswith("## thesis-3.5") and not (path.parent / "table.md").exists()


def test_thesis_47_shows_both_decoders_and_a_missing_analysis_makes_the_table_partial(tmp_path, capsys):
    decoders = [{"model": "ms-1", "decoder": "main", "reads encoder layer": 4, "BLEU": 31.0, "delta": None, "p": None,
                 "mark": ""},
                {"model": "ms-1", "decoder": "aux1", "reads encoder layer": 1, "BLEU": 30.0, "delta": -1.0,
                 "p": 0.02, "mark": "†"}]
    results = {r: {"bleu": 31.0} for r in ("ms-1", "ms-2")}
    make_runs(tmp_path, "thesis-4.7", results, rows="ms-1,ms-2", datasets=["iwslt15-en-vi"],
              analyses={("ms-1", "decoders"): {"decoders.json": decoders}})
    assert report_cli(tmp_path, "thesis-4.7", "--rows", "ms-1,ms-2", "--datasets", "iwslt15-en-vi",
                      "--budget", "60") == 0
    out = capsys.readouterr().out
    assert "| MS-1 | 31.32 | 31.00 | 30.63 | 30.00 | † p=0.020 |" in out
    assert "| MS-2 | 31.13 | – | 30.91 | – |  |" in out  # its analysis did not run
    assert "Incomplete: MS-2 (iwslt15-en-vi): BLEU Main-Decoder (MD): decoders not run" in out
    written = sorted(os.listdir(tmp_path / "runs" / "thesis-4.7"))
    assert "table.smoke.60.rows-ms-1+ms-2.datasets-iwslt15-en-vi.partial.md" in written


def test_the_analyses_a_table_needs_are_planned_as_commands_and_reused(tmp_path, monkeypatch, capsys):
    """thesis-4.7's columns read the decoders analysis: its command (what a user would type)
    is in --dry-run, it runs after training into the run directory, and a second run with the
    same command reuses it; another command (more bootstrap samples) runs it again."""
    table, rows, plans, aps, opts = make_runs(tmp_path, "thesis-4.7", {"ms-1": {"bleu": 1.0}}, rows="ms-1",
                                              datasets=["iwslt15-en-vi"])
    (ap,) = aps
    assert ap.command[:3] == ["python", "-m", "fairseq_ext.analysis.decoders"]
    assert ap.out == os.path.join(plans[0].run_dir, "analysis", "decoders")
    assert "--names ms-1" in planning.shell_line(ap.command) and "--flavour detok-cased" in planning.shell_line(ap.command)
    cli.main(["thesis-4.7", "--dry-run", "--smoke", "--budget", "60", "--rows", "ms-1", "--datasets", "iwslt15-en-vi",
              "--work-dir", opts.work_dir, "--data-root", opts.data_root])
    assert planning.shell_line(ap.command) in capsys.readouterr().out
    calls = []
    monkeypatch.setattr(execute, "run_command", lambda cmd, log, env=None: calls.append(cmd))
    execute.run_analysis(ap)
    execute.run_analysis(ap)
    assert calls == [ap.command]
    again = plan_analyses(table, plans, load_setups(), opts, samples=50)[0]
    execute.run_analysis(again)
    assert len(calls) == 2 and "--samples 50" in planning.shell_line(calls[1])


def test_probing_without_senteval_generates_three_tasks_and_says_why_the_others_are_missing(tmp_path, capsys):
    probing = [{"category": "Surface", "task": "SentLen", "labels": 6, "train": 10, "test": 2, "majority": 16.67,
                "transformer": 60.0, "enc-dc": 62.5},
               {"category": "Surface", "task": "WC", "labels": 100, "train": 10, "test": 2, "majority": 1.0,
                "transformer": 20.0, "enc-dc": 21.0},
               {"category": "Surface", "task": "#AVG", "labels": None, "train": None, "test": None,
                "majority": 8.8, "transformer": 40.0, "enc-dc": 41.75},
               {"category": "Syntactic", "task": "BShift", "labels": 2, "train": 10, "test": 2, "majority": 50.0,
                "transformer": 50.0, "enc-dc": 51.0}]
    table, rows, plans, aps, opts = make_runs(
        tmp_path, "thesis-5.5", {"transformer": {"bleu": 1.0}, "enc-dc": {"bleu": 1.1}},
        analyses={(r, "probing"): {"probing.json": [{k: v for k, v in row.items() if k != ("enc-dc" if r ==
                  "transformer" else "transformer")} for row in probing]} for r in ("transformer", "enc-dc")})
    # SentLen, WC and BShift are generated from the training text of the data set's local copy
    if planning.local_copy(plans[0].data_key, load_setups(), opts) is None:
        pytest.skip(f"no local copy of {plans[0].data_key} under $FAIRSEQ_EXT_DATA")
    assert "--corpus" in aps[0].command and "--lr 2.5e-4 --batch-size 64" in planning.shell_line(aps[0].command)
    assert report_cli(tmp_path, "thesis-5.5", "--budget", "60") == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("| Enc-DC |"))
    assert "| 84.70 | 41.75 |" in line and "| 64.61 | unavailable: no Syntactic #AVG task" in line


def test_meteor_column_reads_the_rows_detokenized_text_or_says_why_not(tmp_path, monkeypatch, capsys):
    """ms-1's METEOR column: fairseq_ext.tools.meteor (here a stand-in with its interface) on the
    row's eval-test/hyp.detok and ref.detok in the data's target language; when it cannot
    score, the column says why."""
    seen = []

    class MeteorUnavailable(Exception):
        pass

    def corpus_score(hypotheses, references, language):
        seen.append((list(hypotheses), list(references), language))
        return {"score": 100.0 * sum(h == r for h, r in zip(hypotheses, references)) / len(references),
                "implementation": "stand-in", "language": language, "sentences": len(references)}

    fake = types.SimpleNamespace(corpus_score=corpus_score, MeteorUnavailable=MeteorUnavailable,
                                 describe=lambda language: "stand-in")
    monkeypatch.setattr(execute, "meteor", fake)  # the module the runner scores METEOR with
    results = {"baseline": {"bleu": 30.0}, "serial": {"bleu": 31.0, "adversarial": {"fr": 12.5}}}
    table, rows, plans, aps, opts = make_runs(tmp_path, "ms-1", results, rows="serial",
                                              datasets=["multi30k-en-de"])
    refs = ["ein Hund .", "zwei Katzen", "ein Haus", "rot", "blau", "grün", "gelb"]
    for p in plans:
        os.makedirs(os.path.join(p.run_dir, "eval-test"))
        hyps = refs[:3] + ["x"] * 4 if p.row == "serial" else refs[:1] + ["x"] * 6
        for name, lines in (("hyp.detok", hyps), ("ref.detok", refs)):
            with open(os.path.join(p.run_dir, "eval-test", name), "w") as f:
                f.writelines(line + "\n" for line in lines)
    for a in aps:
        assert a.name == "meteor"
        execute.run_analysis(a)
    assert seen[0][2] == "de" and seen[0][1] == refs
    assert report_cli(tmp_path, "ms-1", "--rows", "serial", "--datasets", "multi30k-en-de", "--budget", "60") == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("| serial |"))
    assert line.startswith("| serial | baseline | 38.7 ± .9 | 31.00 | +0.40 | +1.00 |")
    assert line.endswith(f"| 57.2 ± .6 | {300 / 7:.2f} | 37.3 ± .6 | 12.50 |")

    def unavailable(*args):
        raise MeteorUnavailable("no METEOR for de here")

    fake.corpus_score = unavailable
    for a in aps:
        os.remove(a.out)
        execute.run_analysis(a)
    report_cli(tmp_path, "ms-1", "--rows", "serial", "--datasets", "multi30k-en-de", "--budget", "60")
    assert "| unavailable: no METEOR for de here |" in capsys.readouterr().out


# ---- what a run writes -------------------------------------------------------------------

MMA4 = {"transformer": 30.0, "plus-local-attention": 30.5, "plus-forward-attention": 30.25,
        "plus-backward-attention": 29.75, "plus-mma": 31.0}


def test_only_a_complete_run_replaces_the_complete_table(tmp_path, monkeypatch, capsys):
    table, rows, plans, _, opts = make_runs(tmp_path, "mma-4", {r: {"bleu": b} for r, b in MMA4.items()})
    out_dir = tmp_path / "runs" / "mma-4"
    assert report_cli(tmp_path, "mma-4", "--budget", "60") == 0
    whole = out_dir / "table.smoke.60.md"
    first = whole.read_text()
    assert "| + MMA | Transformer | 35.41 | 31.00 |  | +0.95 | +1.00 |" in first
    for ext in ("csv", "json", "tex"):
        assert (out_dir / f"table.smoke.60.{ext}").exists()
    # a subset writes beside it, and says so
    assert report_cli(tmp_path, "mma-4", "--rows", "plus-mma", "--budget", "60") == 0
    said = capsys.readouterr().out
    assert whole.read_text() == first and (out_dir / "table.smoke.60.rows-plus-mma.md").exists()
    assert "table.smoke.60.md, the complete table at this scale, is written only by a complete run" in said
    # a run with a row missing writes table....partial
    os.remove(os.path.join(next(p for p in plans if p.row == "plus-local-attention").run_dir, "result.json"))
    assert report_cli(tmp_path, "mma-4", "--budget", "60") == 0
    assert whole.read_text() == first and "(not run)" in (out_dir / "table.smoke.60.partial.md").read_text()
    # a refused run (another run's settings in the directory) fails, and leaves the table as it was

    def refuse_one(plan, *_):
        if plan.row == "plus-local-attention":
            raise planning.ReproduceError(f"{plan.run_dir} holds a run with other settings")
        return execute.finished(plan)

    monkeypatch.setattr(execute, "run", refuse_one)
    with pytest.raises(planning.ReproduceError, match="1 step"):
        cli.main(["mma-4", "--smoke", "--budget", "60", "--work-dir", str(tmp_path / "runs"),
                  "--data-root", str(tmp_path / "data")])
    assert whole.read_text() == first


def test_latex_export_puts_the_papers_numbers_and_ours_side_by_side(tmp_path):
    table, rows, plans, aps, _ = make_runs(tmp_path, "mma-1", {"transformer": {"bleu": 30.0, "params": 70_900_000},
                                                               "transformer-mma": {"bleu": 30.9, "params": 70_900_000}})
    with open(os.path.join(next(p for p in plans if p.row == "transformer-mma" and p.dataset == "wat17-en-ja").run_dir,
                           "significance.json"), "w") as f:
        json.dump({"baseline": "transformer", "mark": "††", "p_value": 0.001}, f)
    records = build_rows(table, plans, rows, aps)
    tex = latex(table, records, scales(table, plans))
    assert tex.count("\\begin{tabular}") == 2 == tex.count("\\toprule") == tex.count("\\midrule") \
        == tex.count("\\bottomrule")
    assert "\\multicolumn{2}{c}{\\#Params}" in tex and "& paper & ours &" in tex
    # the paper's marks and ours as superscripts, the printed Δ beside ours
    assert "34.39\\(^{\\dagger\\dagger}\\) & 30.90\\(^{\\dagger\\dagger}\\) & +0.81 & +0.90" in tex
    assert "Smoke scale: a pipeline check, not evidence." in tex
    for block in tex.split("\\begin{tabular}{")[1:]:
        spec, body = block.split("}", 1)
        for line in body.split("\\bottomrule")[0].splitlines():
            if line.endswith("\\\\") and "multicolumn" not in line:
                assert len(re.findall(r"(?<!\\)&", line)) == len(spec) - 1, line
    assert latex_escape("#AVG_1 & 5% {x} --beam") == "\\#AVG\\_1 \\& 5\\% \\{x\\} -{}-beam"
    if shutil.which("pdflatex"):  # compile it where LaTeX is installed
        doc = tmp_path / "doc.tex"
        doc.write_text("\\documentclass{article}\\usepackage[utf8]{inputenc}\\usepackage{booktabs}"
                       "\\begin{document}\n" + tex + "\\end{document}\n")
        proc = subprocess.run(["pdflatex", "-interaction=nonstopmode", doc.name], cwd=tmp_path, capture_output=True)
        assert proc.returncode == 0, proc.stdout[-2000:]


# ---- the table configs ---------------------------------------------------------------------

def _broken(tmp_path, table_id, change):
    config = tmp_path / "tables"
    config.mkdir(exist_ok=True)
    shutil.copy(os.path.join(TABLE_DIR, "setups.yaml"), config / "setups.yaml")
    with open(os.path.join(TABLE_DIR, f"{table_id}.yaml"), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    change(raw)
    with open(config / f"{table_id}.yaml", "w", encoding="utf-8") as f:
        yaml.safe_dump(raw, f, allow_unicode=True, sort_keys=False)
    return str(config)


def _row(raw, row_id):
    return next(r for r in raw["rows"] if r["id"] == row_id)


@pytest.mark.parametrize("table_id, change, message", [
    ("mma-3", lambda raw: raw["columns"][0].update(source="bleuu"), "column 'BLEU': source 'bleuu' is not one of"),
    ("mma-3", lambda raw: raw["columns"][1].pop("of"), "row transformer: column 'Δ' (source delta) needs 'of'"),
    ("mma-3", lambda raw: raw["columns"][1].update(beam=4), "column 'Δ': key 'beam' is not a parameter of source"),
    ("mma-3", lambda raw: _row(raw, "transformer-mma").update(compare_with="nope"),
     "row transformer-mma: compare_with 'nope' is not a row"),
    ("mma-3", lambda raw: _row(raw, "transformer-mma").update({"compare-with": "transformer"}),
     "row transformer-mma: unknown key 'compare-with'"),
    ("mma-3", lambda raw: _row(raw, "transformer")["paper"]["iwslt14-de-en"].update(BLUE="1"),
     "row transformer: paper: iwslt14-de-en: 'BLUE' is not a column"),
    ("thesis-3.5", lambda raw: raw["columns"][0].pop("layer"),
     "row s-agg: column 'ΔBLEU masking encoder layer 1' (source layer_dependency) needs 'layer'"),
    ("wt-2", lambda raw: _row(raw, "layer-3").update(flags="--arch multilayer_transformer_iwslt"),
     "row layer-3: model 'layer-0' has other flags"),
    ("wt-2", lambda raw: _row(raw, "layer-3")["analysis"].update(layer="third"),
     "row layer-3: column 'BLEU1 (BPE, case-insensitive)': layer 'third' is not a layer number"),
    ("thesis-4.8", lambda raw: raw["columns"][0].update(task="Length"),
     "task 'Length' is not one of"),
])
def test_table_config_errors_name_the_file_row_and_key(tmp_path, table_id, change, message):
    config = _broken(tmp_path, table_id, change)
    with pytest.raises(TableConfigError) as e:
        load_table(table_id, config_dir=config)
    assert message in str(e.value) and f"{table_id}.yaml" in str(e.value)


def test_every_table_names_a_source_for_every_printed_column():
    from fairseq_ext.reproduce.tables import load_tables

    for table in load_tables():
        printed = {name for r in table.rows for cells in r.paper.values() for name in cells}
        assert printed == set(table.metrics), table.id
        assert all(c.source != "bleu" or c.name == "BLEU" for c in table.columns), table.id


def test_the_analyses_a_table_reads_are_the_registered_ones():
    """A column source's analysis and the runner's command for it name an analysis the
    package has (fairseq_ext/analysis/registry.py), and the runner calls its module."""
    from fairseq_ext.analysis import registry
    from fairseq_ext.reproduce.planning import ANALYSIS_COMMANDS
    from fairseq_ext.reproduce.tables import SOURCES

    read = {s.analysis for s in SOURCES.values() if s.analysis}
    assert read == set(ANALYSIS_COMMANDS) and read <= set(registry.analyses())
    plan = planning.RunPlan(table="t", row="r", label="r", dataset="d", data_key="d", substitution="",
                            bleu="detok-cased", data_dir="bin", run_dir="run", prepare=None, train=[], average=None,
                            evaluate=[], checkpoint="run/checkpoint_best.pt", budget="")
    cmd, _ = planning.analysis_command("word_translation", None, plan, "out", {}, None, 10)
    assert cmd[:3] == ["python", "-m", "fairseq_ext.analysis.word_translation"]


# ---- end to end ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.release
def test_an_analysis_table_end_to_end_at_a_tiny_budget(smoke_data_root, tmp_path):
    """thesis-4.7 with MS-1 on the smoke substitute of En->Vi, 30 updates: training, evaluation,
    then the decoders analysis (the command a user would type) in the run directory, and the
    table shows the paper's MD and AD numbers beside ours; a second call reuses everything."""
    if not os.path.isdir(MULTI30K):
        pytest.skip(f"no Multi30k copy at {MULTI30K}")
    cmd = [os.path.join(REPO, "scripts", "reproduce.sh"), "thesis-4.7", "--rows", "ms-1", "--datasets",
           "iwslt15-en-vi", "--smoke", "--budget", "30", "--work-dir", str(tmp_path / "runs"),
           "--data-root", str(tmp_path / "data"), "--samples", "50"]
    shutil.copytree(smoke_data_root, tmp_path / "data", symlinks=True)  # prepared as the runner prepares it
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = tmp_path / "runs" / "thesis-4.7"
    run = next((runs / "ms-1").iterdir())
    with open(run / "analysis" / "decoders" / "decoders.json") as f:
        decoders = {r["decoder"]: r for r in json.load(f)}
    assert set(decoders) == {"main", "aux1"}
    with open(runs / "table.smoke.30.rows-ms-1.datasets-iwslt15-en-vi.json") as f:
        (record,) = json.load(f)["rows"]
    cells = record["columns"]
    assert cells["BLEU Main-Decoder (MD)"]["paper"] == "31.32" and cells["BLEU Aux-Decoder l (AD)"]["paper"] == "30.63"
    assert cells["BLEU Main-Decoder (MD)"]["ours"] == decoders["main"]["BLEU"]
    assert cells["BLEU Aux-Decoder l (AD)"]["ours"] == decoders["aux1"]["BLEU"]
    with open(run / "result.json") as f:
        result = json.load(f)
    assert decoders["main"]["BLEU"] == pytest.approx(result["bleu"])  # the main decoder is the model
    assert result["model"]["encoder_layers"] == 4 and result["updates"] == 30
    assert "python -m fairseq_ext.analysis.decoders --checkpoint" in proc.stdout
    assert "training: 30 updates per row (30 of 30 updates done)" in proc.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp_path))
    assert again.returncode == 0 and again.stdout.count("finished before: reused") == 2
