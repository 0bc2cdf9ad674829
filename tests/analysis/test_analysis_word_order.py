"""Which checkpoints word_order compares (fairseq_ext/analysis/word_order.py, MMA paper
Table 3): each model with its counterpart trained without encoder positions, formed from the
checkpoints' configurations (fairseq's own parser makes them here), from --pairs, or from
shared --names; a checkpoint without counterpart is reported and drawn as alone."""
import logging
import os

import pytest

from fairseq_ext.analysis import AnalysisError, decoding, word_order
from fairseq_ext.model_builder import parse_model_args
from fixed_decodings import fixed_decodings

MMA = ("--encoder-attention-heads", "4", "--encoder-self-attention", "mma", "--mma-heads", "G,L,F,B")
FLAGS = {
    "base": (),
    "base-nopos": ("--no-token-positional-embeddings",),
    "mma": MMA,
    "mma-nopos": MMA + ("--no-encoder-positional-embeddings",),
    "deep": ("--encoder-layers", "7"),  # another Transformer, trained only with positions
    "base-seed2": ("--seed", "2", "--lr", "0.003"),  # training settings differ, the model does not
}


@pytest.fixture(scope="module")
def configs():
    return {name: parse_model_args("multilayer_transformer", *flags) for name, flags in FLAGS.items()}


def ckpt(name):
    return os.path.join("runs", name, "checkpoint_best.pt")


@pytest.fixture
def saved(configs, monkeypatch):
    """checkpoint_config answers with the configurations above (runs/NAME/checkpoint_best.pt)."""
    by_path = {ckpt(name): cfg for name, cfg in configs.items()}
    monkeypatch.setattr(word_order, "checkpoint_config", lambda path: by_path[path])


def entry(name, positions):
    return {"checkpoint": ckpt(name), "positions": positions}


def test_each_model_pairs_with_its_counterpart_by_configuration(saved, caplog):
    """One name per checkpoint, in any order (what the report passes): the model without
    positions pairs with the model of the same options; the deeper Transformer has none."""
    order = ["mma-nopos", "base", "deep", "mma", "base-nopos"]
    with caplog.at_level(logging.WARNING):
        systems = word_order.pair_checkpoints([ckpt(n) for n in order], order)
    assert list(systems) == ["mma", "base", "deep"]  # named after the model with positions
    assert systems["mma"] == {"pos": entry("mma", "sinusoidal"), "nopos": entry("mma-nopos", "none")}
    assert systems["base"] == {"pos": entry("base", "sinusoidal"), "nopos": entry("base-nopos", "none")}
    assert systems["deep"] == {"pos": entry("deep", "sinusoidal")}
    # the warning says why: the closest candidate and the one option it differs in
    alone = [r.getMessage() for r in caplog.records if "no counterpart" in r.getMessage()]
    assert len(alone) == 1 and ckpt("deep") in alone[0] and ckpt("base-nopos") in alone[0]
    assert alone[0].split("differs in ")[1].startswith("--encoder-layers)")
    # without --names the systems are named from the configurations, the directory telling
    # two Transformers apart
    systems = word_order.pair_checkpoints([ckpt(n) for n in order])
    assert list(systems) == ["Transformer MMA", "Transformer (base)", "Transformer (deep)"]
    assert systems["Transformer (base)"]["nopos"] == entry("base-nopos", "none")


def test_training_settings_do_not_part_a_pair_but_two_candidates_need_pairs(saved):
    systems = word_order.pair_checkpoints([ckpt("base-seed2"), ckpt("base-nopos")], ["seed2", "nopos"])
    assert systems == {"seed2": {"pos": entry("base-seed2", "sinusoidal"), "nopos": entry("base-nopos", "none")}}
    three = [ckpt("base"), ckpt("base-seed2"), ckpt("base-nopos")]
    with pytest.raises(AnalysisError, match=r"base-nopos/checkpoint_best.pt \(without encoder positions\) has 2 "
                                                   r"counterparts .*--pairs WITH:WITHOUT"):
        word_order.pair_checkpoints(three, ["base", "seed2", "nopos"])
    systems = word_order.pair_checkpoints(three, ["base", "seed2", "nopos"], ["seed2:nopos"])
    assert systems == {"base": {"pos": entry("base", "sinusoidal")},
                       "seed2": {"pos": entry("base-seed2", "sinusoidal"), "nopos": entry("base-nopos", "none")}}
    # --pairs by the default names (the checkpoints' directories); a pair across architectures
    systems = word_order.pair_checkpoints([ckpt("mma"), ckpt("base-nopos")], None, ["mma:base-nopos"])
    assert systems == {"Transformer MMA": {"pos": entry("mma", "sinusoidal"), "nopos": entry("base-nopos", "none")}}


@pytest.mark.parametrize("pairs, message", [
    (["nopos:base"], r"--pairs nopos:base: nopos \(runs/base-nopos/checkpoint_best.pt\) has no encoder positions"),
    (["base:seed2"], r"--pairs base:seed2: seed2 .* has encoder positions"),
    (["base:other"], r"no checkpoint is named 'other' \(the names: base, seed2, nopos\)"),
    (["base"], r"--pairs base: expected WITH:WITHOUT"),
    (["base:nopos", "seed2:nopos"], r"--pairs seed2:nopos: nopos is in two pairs"),
])
def test_pairs_errors_name_the_option(saved, pairs, message):
    with pytest.raises(AnalysisError, match=message):
        word_order.pair_checkpoints([ckpt("base"), ckpt("base-seed2"), ckpt("base-nopos")], ["base", "seed2", "nopos"],
                                    pairs)


def test_a_shared_name_still_makes_a_pair(saved):
    systems = word_order.pair_checkpoints([ckpt("deep"), ckpt("mma-nopos"), ckpt("base")], ["x", "x", "base"])
    assert systems == {"x": {"pos": entry("deep", "sinusoidal"), "nopos": entry("mma-nopos", "none")},
                       "base": {"pos": entry("base", "sinusoidal")}}
    with pytest.raises(AnalysisError, match="--pairs refers to checkpoints by name"):
        word_order.pair_checkpoints([ckpt("deep"), ckpt("mma-nopos")], ["x", "x"], ["x:x"])


def test_a_checkpoint_alone_is_noted_and_drawn_hollow(tmp_path, monkeypatch):
    """Rows from fixed decodings: the pair gets its drop, the lone model a note and no drop;
    the figure fills the pair's bars and draws the lone one hollow, hatched, labelled alone."""
    refs = [f"the cat number {i} sat on the mat" for i in range(23)]
    outputs = {"a": refs, "a0": [r.replace("cat", "dog") if i % 2 else r for i, r in enumerate(refs)],
               "b": [r.replace("mat", "rug") for r in refs]}

    monkeypatch.setattr(decoding, "evaluate", fixed_decodings(outputs, refs, "detok-lc"))
    systems = {"A": {"pos": {"checkpoint": "a", "positions": "sinusoidal"}, "nopos": {"checkpoint": "a0",
                                                                                        "positions": "none"}},
               "B": {"pos": {"checkpoint": "b", "positions": "learned"}}}
    rows = word_order.word_order_rows(systems, "data", "test", str(tmp_path), samples=50)
    assert [(r["model"], r["encoder positions"], r["note"]) for r in rows] == [
        ("A", "sinusoidal", ""), ("A", "none", ""), ("B", "learned", "alone: no counterpart without encoder positions")]
    assert rows[1]["delta"] is not None and rows[1]["delta"] < 0 and rows[2]["delta"] is None
    assert {r["flavour"] for r in rows} == {"detok-lc"}
    fig = word_order.plot(rows, str(tmp_path / "wo.png"))
    ax = fig.axes[0]
    filled = [p for p in ax.patches if p.get_fill()]
    hollow = [p for p in ax.patches if not p.get_fill()]
    assert len(filled) == 2 and len(hollow) == 1
    assert hollow[0].get_hatch() == "//" and hollow[0].get_height() == pytest.approx(rows[2]["BLEU"])
    assert hollow[0].get_x() + hollow[0].get_width() / 2 == pytest.approx(1)  # centred on B's tick
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith(f"{rows[2]['BLEU']:.2f}\nalone") for t in texts)
    assert sum(t.startswith("Δ") for t in texts) == 1  # the pair's drop only
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "with encoder positions", "without (- Position Embedding)", "alone: no counterpart, no drop"]
