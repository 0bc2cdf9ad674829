"""A table file by path: `configs/benchmarks/...` as the docs write it works outside a checkout too."""
import pytest

from fairseq_ext.reproduce.tables import TableConfigError, load_table


def test_a_configs_path_is_found_in_the_package_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    table = load_table("configs/benchmarks/cpu-multi30k.yaml")
    assert table.id == "cpu-multi30k" and table.baseline == "baseline"
    assert table.row("mma").label == "MMA (G,L,F,B)"


def test_a_file_of_ones_own_wins_and_a_missing_one_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TableConfigError, match=r"no table file configs/benchmarks/nothere\.yaml .*cpu-multi30k\.yaml"):
        load_table("configs/benchmarks/nothere.yaml")
    own = tmp_path / "configs" / "benchmarks" / "cpu-multi30k.yaml"
    own.parent.mkdir(parents=True)
    own.write_text("not: a table\n", encoding="utf-8")
    with pytest.raises(TableConfigError, match="expected a mapping with 'id'"):
        load_table("configs/benchmarks/cpu-multi30k.yaml")  # the user's file, not the shipped one
