"""The papers' printed numbers read as their authors meant them: each printed difference (the
number in parentheses) is against the row the paper means, a row is never tested against its
own model, and a printed difference that the table's own numbers contradict is said on the
page."""
import os
import shlex

import pytest

from fairseq_ext.reproduce import planning
from fairseq_ext.reproduce.readers import scales
from fairseq_ext.reproduce.render import contradicted_differences, markdown, printed_parenthesis
from fairseq_ext.reproduce.rows import build_rows
from fairseq_ext.reproduce.tables import load_setups, load_table, table_ids

CONFIGS = os.path.join(os.path.dirname(planning.__file__), "..", "configs")

# the three printed differences the papers' own numbers contradict (checked by hand)
CONTRADICTED = {
    ("mlmha-2", "Transformer + Transparent Attention", "(+0.13)", "28.48 − 28.37 = +0.11"),
    ("mlmha-4", "M-11", "(+0.17)", "30.78 − 30.58 = +0.20"),
    ("thesis-3.3", "M-11", "(+0.17)", "30.78 − 30.58 = +0.20"),
}


def test_printed_parenthesis():
    assert printed_parenthesis("31.29 (−0.03)") == -0.03
    assert printed_parenthesis("29.08 (+0.71)‡") == 0.71
    assert printed_parenthesis("( - 1.2 )") == -1.2
    assert printed_parenthesis("30.58") is None and printed_parenthesis(None) is None


@pytest.mark.parametrize("table_id", ["thesis-4.1", "thesis-4.2", "thesis-4.3", "thesis-4.4"])
def test_an_aif_row_is_compared_with_its_ms_row(table_id):
    """The thesis' parentheses of MS-l+AIF are its gain over MS-l (the caption says so):
    Δ ours and the significance test are against that row, not the Transformer."""
    table = load_table(table_id)
    aif = [r for r in table.rows if r.id.endswith("-plus-aif")]
    assert aif
    for row in aif:
        assert table.reference(row).id == row.id[:-len("-plus-aif")], row.id


def test_no_row_is_compared_with_its_own_model():
    """thesis-4.6 repeats its baseline as the head of part (b): the same model, so no Δ and
    no test of a system against itself (rows on the layers of one model, wt-2's, still are)."""
    table = load_table("thesis-4.6")
    assert table.reference(table.row("baseline-2")) is None
    assert table.reference(table.row("ms-1")).id == "baseline-2"
    for table_id in table_ids():
        table = load_table(table_id)
        for row in table.rows:
            reference = table.reference(row)
            if reference is not None:  # one model is compared with itself only on other measurements
                assert table.owner(reference).id != table.owner(row).id or reference.analysis != row.analysis, \
                    (table_id, row.id)


def test_every_printed_difference_agrees_with_its_table_or_is_said():
    found = set()
    for table_id in table_ids():
        for line in contradicted_differences(load_table(table_id)):
            label = line.split(" (", 1)[0]
            printed = "(" + line.split("the paper prints (", 1)[1].split(")", 1)[0] + ")"
            recomputed = line.split("its own numbers give ", 1)[1].split(";", 1)[0]
            found.add((table_id, label, printed, recomputed))
    assert found == CONTRADICTED


def test_the_page_says_which_printed_difference_is_contradicted(tmp_path):
    table = load_table("thesis-3.3")
    opts = planning.Options(work_dir=str(tmp_path), data_root=str(tmp_path / "d"), budget="100")
    plans = planning.plan_table(table, table.select("m-11"), load_setups(), opts)
    records = build_rows(table, plans)
    page = markdown(table, records, scales(table, plans))
    assert ("paper, M-11 (iwslt15-en-vi, BLEU): the paper prints (+0.17) against Transformer, but its own numbers "
            "give 30.78 − 30.58 = +0.20; Δ paper shows the latter.") in page
    assert "Transparent" not in page.split("paper, ", 1)[1]  # only the data sets and rows of this page


def test_the_multi_source_tables_are_scored_and_trained_as_the_paper_did(tmp_path):
    """MultEval scores tokenized, lowercased text (the WMT multimodal task's preprocessing):
    BLEU tok-lc. The Europarl models (ms-2, d_model 256) train on batches of 24 sentences
    with the Noam peak of d_model 256; the Multi30k ones (ms-1, d_model 512) on 32 with 1.4e-4."""
    setups = load_setups()
    opts = planning.Options(work_dir=str(tmp_path), data_root=str(tmp_path / "d"), budget="100")
    for table_id, batch, lr, d_model in (("ms-1", "32", "1.4e-4", 512), ("ms-2", "24", "1.98e-4", 256)):
        table = load_table(table_id)
        assert {d["bleu"] for d in table.datasets.values()} == {"tok-lc"}
        plan = next(p for p in planning.plan_table(table, table.select("serial"), setups, opts) if p.row == "serial")
        config = plan.train[plan.train.index("--config") + 1]
        with open(os.path.join(CONFIGS, f"{config}.args"), encoding="utf-8") as f:
            args = shlex.split(f.read(), comments=True)
        train = args + plan.train[plan.train.index("--") + 1:]  # what fairseq-train gets: the last value wins

        def last(flag, default=None):
            return train[len(train) - train[::-1].index(flag)] if flag in train else default

        assert last("--batch-size") == batch and float(last("--lr")) == float(lr)
        assert int(last("--encoder-embed-dim", 512)) == d_model
        assert float(lr) == pytest.approx(0.2 * d_model ** -0.5 * 4000 ** -0.5, rel=0.01)
        assert plan.evaluate[plan.evaluate.index("--headline") + 1] == "tok-lc"


def test_the_convergence_note_of_thesis_3_5_is_in_its_run_files():
    """docs/reproduction.md quotes S-Agg's validation losses at 800 and 1524 updates: both are
    in the stored training logs, as every number of that page comes from a stored file."""
    import glob

    runs = os.path.join(os.path.dirname(planning.__file__), "..", "..", "docs", "benchmarks", "thesis-3.5-cpu")
    with open(os.path.join(runs, "..", "..", "reproduction.md"), encoding="utf-8") as f:
        page = f.read()
    assert "from 7.34 at 800 updates" in page and "to 6.77\n  at 1524" in page
    logs = {name: open(path, encoding="utf-8").read()
            for name in ("train.first800.log", "train.log") for path in glob.glob(os.path.join(runs, "s-agg", "*", name))}
    assert "| loss 7.339 |" in logs["train.first800.log"] and "| num_updates 800 |" in logs["train.first800.log"]
    assert "| loss 6.765 |" in logs["train.log"] and "| num_updates 1524 |" in logs["train.log"]


def test_a_paper_without_marks_is_not_said_to_have_them(tmp_path):
    """The multi-source paper prints ± intervals and no marks (and thesis-4.7 none): their
    legend says ours follow the thesis' convention, where a table with marks says they are
    the paper's."""
    for table_id, said in (("ms-1", "this table prints no marks; ours follow the thesis' convention: † p < 0.05, ‡ p < 0.01"),
                           ("thesis-4.7", "this table prints no marks; ours follow the thesis' convention"),
                           ("thesis-3.2", "marks as this paper's: † p < 0.05, ‡ p < 0.01")):
        table = load_table(table_id)
        opts = planning.Options(work_dir=str(tmp_path / table_id), data_root=str(tmp_path / "d"), budget="100")
        row = {"ms-1": "serial", "thesis-4.7": "ms-1", "thesis-3.2": "m-10"}[table_id]
        plans = planning.plan_table(table, table.select(row), load_setups(), opts)
        page = markdown(table, build_rows(table, plans), scales(table, plans))
        assert said in page, page[-1500:]


def test_an_update_of_the_word_translation_setup_holds_at_least_25k_target_tokens():
    """wt-4/wt-6 (Xu et al. 2020, Sec. 2): "each training batch contained at least 25k target
    tokens". --max-tokens bounds a batch's padded max(source, target) tokens, so the target
    tokens of an update are fewer than --max-tokens x --update-freq: batched by fairseq's own
    batch_by_size on Multi30k's training lengths (whitespace tokens of the local copy), the
    setup's updates still hold 25k target tokens on average."""
    import gzip

    import numpy as np
    from fairseq.data import data_utils

    from script_utils import MULTI30K

    if not (MULTI30K / "train.de.gz").exists():
        pytest.skip(f"needs the local Multi30k copy in {MULTI30K}")
    with open(os.path.join(CONFIGS, "wt-wmt14.args"), encoding="utf-8") as f:
        args = shlex.split(f.read(), comments=True)
    max_tokens, update_freq = int(args[args.index("--max-tokens") + 1]), int(args[args.index("--update-freq") + 1])
    lengths = {}
    for lang in ("en", "de"):
        with gzip.open(MULTI30K / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lengths[lang] = np.array([len(line.split()) + 1 for line in f])  # + EOS
    src, tgt = lengths["en"], lengths["de"]
    budget = np.maximum(src, tgt)
    batches = data_utils.batch_by_size(np.lexsort((src, tgt)), lambda i: budget[i], max_tokens=max_tokens,
                                       required_batch_size_multiple=8)
    target_per_batch = sum(int(tgt[b].sum()) for b in batches) / len(batches)
    assert 0.8 < target_per_batch / max_tokens < 0.95  # fewer than the budget: why --update-freq is 8, not 6
    assert target_per_batch * update_freq >= 25_000
    assert target_per_batch * 6 < 25_000


def test_a_p_value_below_printing_precision_is_not_printed_as_zero():
    from fairseq_ext.reproduce.rows import p_text

    assert p_text(0.0001) == "<0.001" and p_text(0.0004) == "<0.001"
    assert p_text(0.0005) == "=0.001" and p_text(0.0134) == "=0.013" and p_text(1.0) == "=1.000"


def test_iwslt_rows_decode_sentences_longer_than_their_training_positions(tmp_path):
    """configs/iwslt.args trains with 150 positions; IWSLT test sets hold longer sentences,
    which fairseq-generate refuses: the evaluation raises the (sinusoidal) positions."""
    table = load_table("thesis-3.3")
    opts = planning.Options(work_dir=str(tmp_path), data_root=str(tmp_path / "d"), budget="100")
    plan = next(p for p in planning.plan_table(table, table.select("m-10"), load_setups(), opts)
                if p.dataset == "iwslt15-en-vi" and p.row == "m-10")
    overrides = plan.evaluate[plan.evaluate.index("--model-overrides") + 1]
    assert eval(overrides) == {"max_source_positions": 1024, "max_target_positions": 1024}
    with open(os.path.join(CONFIGS, "iwslt.args"), encoding="utf-8") as f:
        assert "--max-source-positions 150" in f.read()
    with open(os.path.join(CONFIGS, "iwslt.args"), encoding="utf-8") as f:
        assert "learned-pos" not in f.read()  # sinusoidal: the same model up to 150 positions
