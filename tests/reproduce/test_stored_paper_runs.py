"""The paper stage's stored GPU runs (docs/benchmarks/paper-*: their run.json records, converted into the table
runner's layout by scripts/convert_paper_runs.py) render through the runner's one table writer with the numbers their
run.json records hold: BLEU, chrF, and the Δ and AR p the earlier writer printed."""
import json
import os
import shlex
import shutil

import pytest

from fairseq_ext.reproduce import __main__ as cli
from model_utils import REPO

# folder -> {(settings, row): p printed by the earlier writer against the baseline}
PRINTED_P = {"paper-iwslt15-en-vi-h200": {("0.208", "iter-c-agg"): 0.865, ("0.108", "iter-c-agg"): 0.0001},
             "paper-iwslt15-en-vi": {("3000", "iter-c-agg"): 0.0025}}


@pytest.mark.parametrize("folder", sorted(PRINTED_P))
def test_stored_runs_render_with_their_numbers(folder, tmp_path):
    stored = os.path.join(REPO, "docs", "benchmarks", folder)
    shutil.copytree(stored, tmp_path / folder)
    text = open(os.path.join(stored, "paper.md"), encoding="utf-8").read()
    commands = [shlex.split(line.strip("`"))[2:] for line in text.splitlines() if line.startswith("`fairseq-ext")]
    runs = [json.load(open(os.path.join(stored, "paper", "runs", name, "run.json")))
            for name in os.listdir(os.path.join(stored, "paper", "runs"))]
    assert len(commands) == len({(r["updates_planned"], r["lr"]) for r in runs}) >= 1
    for argv in commands:
        argv = [a.replace(os.path.join("docs", "benchmarks", folder), str(tmp_path / folder)) for a in argv]
        written = []
        assert cli.main(argv, written) == 0
        rows = {r["row"]: r for r in json.load(open(written[0][:-3] + ".json"))["rows"] if r["status"] == "done"}
        setting = argv[argv.index("--share") + 1] if "--share" in argv else argv[argv.index("--budget") + 1]
        ours = {r["row"]: r for r in runs if setting in (f"{r['updates_planned'] / 12500:g}",
                                                         str(r["updates_planned"]))}
        assert set(rows) == set(ours) == {"transformer", "iter-c-agg"}
        for row, record in ours.items():
            assert rows[row]["bleu"] == record["bleu"]
        assert rows["iter-c-agg"]["delta"] == pytest.approx(ours["iter-c-agg"]["bleu"] - ours["transformer"]["bleu"])
        assert rows["iter-c-agg"]["p_value"] == pytest.approx(PRINTED_P[folder][(setting, "iter-c-agg")], abs=5e-4)


def test_a_nan_bleu_is_a_failed_run_named(tmp_path):
    """A run whose evaluation gave BLEU nan fails the table command, named (not printed as a number with exit 0)."""
    from fairseq_ext.errors import FairseqExtError

    folder = "paper-iwslt15-en-vi-h200"
    shutil.copytree(os.path.join(REPO, "docs", "benchmarks", folder), tmp_path / folder)
    run = tmp_path / folder / "paper" / "thesis-3.3" / "transformer" / "iwslt15-en-vi.share0.208"
    result = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text(json.dumps({**result, "bleu": float("nan")}))
    line = next(line for line in open(tmp_path / folder / "paper.md", encoding="utf-8") if "--share 0.208" in line)
    argv = [a.replace(os.path.join("docs", "benchmarks", folder), str(tmp_path / folder))
            for a in shlex.split(line.strip().strip("`"))[2:]]
    with pytest.raises(FairseqExtError, match=r"Transformer \(iwslt15-en-vi\): its BLEU is nan, a failed evaluation"):
        cli.main(argv)
