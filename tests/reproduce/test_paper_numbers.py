"""The papers' printed numbers read as their authors meant them: each printed difference (the
number in parentheses) is against the row the paper means, a row is never tested against its
own model, and a printed difference that the table's own numbers contradict is said on the
page."""
import pytest

from fairseq_ext.reproduce import planning
from fairseq_ext.reproduce.markdown import markdown
from fairseq_ext.reproduce.paper_checks import contradicted_differences, printed_parenthesis
from fairseq_ext.reproduce.rows import build_rows
from fairseq_ext.reproduce.scale import scales
from fairseq_ext.reproduce.tables import load_setups, load_table, table_ids

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
