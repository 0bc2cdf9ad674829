"""The paper stage's table (``fairseq-ext selfcheck --stage paper --table-only``) from run.json
files alone: its title names the tables it holds, and a row is not compared with a reference
run that did not learn."""
import json

from fairseq_ext.selfcheck import training


def write_run(out, row, lr, bleu, flags=None):
    updates, warmup = (1350, 200) if lr == 0.002 else (2600, 400)
    name = f"{row}-s1-u{updates}-mt32768-lr{lr:g}-wu{warmup}"
    folder = out / "paper" / "runs" / name
    folder.mkdir(parents=True)
    record = {"name": name, "row": row, "seed": 1, "updates_planned": updates, "max_tokens": 32768, "lr": lr,
              "warmup": warmup, "updates": updates, "bleu": bleu, "chrf": 40.0, "target_tokens": 31948213,
              "train_wall_s": 164.4, "train_ups": 11.5, "valid_loss": 5.1, **({"flags": flags} if flags else {})}
    (folder / "run.json").write_text(json.dumps(record))


def test_the_table_names_its_tables_and_compares_only_with_a_reference_that_learned(tmp_path):
    # the H200's Table 3.3 runs (docs/benchmarks/paper-iwslt15-en-vi-h200/): lr 2e-3 left the baseline at BLEU 0.39
    for row, lr, bleu in (("transformer", 0.002, 0.39), ("iter-c-agg", 0.002, 22.69),
                          ("transformer", 0.001, 26.57), ("iter-c-agg", 0.001, 26.53)):
        write_run(tmp_path, row, lr, bleu)
    lines = training.write_table(str(tmp_path))
    assert lines[0] == "# Thesis Table 3.3 on one device: IWSLT'15 En-Vi"
    high, low = (next(l for l in lines if l.startswith(f"| Iter-C-Agg | {s}")) for s in ("1,350", "2,600"))
    assert "+22.30" not in high and "the reference did not learn (BLEU 0.39)" in high
    assert "| -0.04 |" in low
    rows = json.loads((tmp_path / "paper.json").read_text())["rows"]
    high, low = (r["delta_to_reference"] for r in rows if r["row"] == "iter-c-agg")
    assert high is None and round(low, 2) == -0.04
    for table_id in ("thesis-4.1", "thesis-5.3"):  # each title: the tables present, in the thesis' order
        flags = training.row_flags(training.load_table(table_id).row(training.DEFAULT_ROWS[table_id].split(",")[1]))
        write_run(tmp_path, training.slugs()[flags], 0.001, 27.0, flags)
    assert training.write_table(str(tmp_path))[0] == "# Thesis Tables 3.3, 4.1 and 5.3 on one device: IWSLT'15 En-Vi"
