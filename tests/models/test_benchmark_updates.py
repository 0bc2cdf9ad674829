"""``fairseq-ext benchmark --mode updates`` at tiny sizes on the CPU: the batches are
fairseq-train's (cut by --max-tokens from the data's lengths; none lost by batch_by_size), an
update is fairseq's Trainer step with Adam, the numbers of the JSON hold together (tokens per
second x seconds = the batches' target tokens), and every row of the thesis' overhead list
runs."""
import json
import logging
import os

import numpy as np
import pytest
import torch

from model_utils import make_tiny_parallel_data

from fairseq_ext.model_builder import make_dictionary
from fairseq_ext.selfcheck import benchmark, updates
from fairseq_ext.selfcheck import updates as batches
from fairseq_ext.selfcheck import timing as measure
from fairseq_ext.selfcheck.timing import BASE_ROWS, ROWS

TINY = measure.SIZES["tiny"]
SWEEP = [61, 250]  # not multiples of 8


@pytest.fixture(scope="module")
def tiny_bin(tmp_path_factory):
    return make_tiny_parallel_data(str(tmp_path_factory.mktemp("bench_updates")), num_train=200)


@pytest.fixture(autouse=True)
def logging_back():
    yield
    logging.disable(logging.NOTSET)  # benchmark.main silences fairseq's logging for the process


def stock_trainer(dictionary):
    flags = updates.train_flags("tiny", ["--cpu"])
    return updates.build_trainer(TINY[0], flags, updates.STOCK_CRITERION, dictionary, seed=0)


def test_lengths_of_a_binarized_dir_are_its_text_word_counts_plus_eos(tiny_bin):
    src, tgt, info = batches.corpus_lengths([tiny_bin], "train", 0)
    raw = os.path.join(os.path.dirname(tiny_bin), "raw")
    text_src, text_tgt, text_info = batches.corpus_lengths([f"{raw}/train.src", f"{raw}/train.tgt"], "train", 0)
    assert info["kind"] == "binarized" and text_info["kind"] == "text" and "proxy" in text_info["what"]
    assert len(src) == 200 and (src == text_src).all() and (tgt == text_tgt).all()
    with pytest.raises(ValueError, match="--data .*no binarized valid2 split"):
        batches.corpus_lengths([tiny_bin], "valid2", 0)


def test_batches_are_fairseq_trains_within_max_tokens_and_none_is_lost():
    dictionary = make_dictionary(100)
    trainer = stock_trainer(dictionary)
    src, tgt, _ = batches.corpus_lengths(None, "train", 0)
    dataset = batches.pair_dataset(src, tgt, dictionary, 0)
    for max_tokens in SWEEP:
        samples, info = batches.train_batches(trainer, dataset, max_tokens, 30, 0, 8)
        assert len(samples) == 30 and info["too_long"] == int(((src > min(150, max_tokens)) |
                                                                (tgt > min(150, max_tokens))).sum())
        for s in samples:  # fairseq counts a pair as max(source, target) tokens, padded to the batch's longest
            assert s["net_input"]["src_tokens"].numel() <= max_tokens and s["target"].numel() <= max_tokens
            assert s["ntokens"] == int(s["target"].ne(dictionary.pad()).sum())
    # fairseq 0.12's batch_by_size drops a last batch not a multiple of 8 (here sentence 39 of
    # sizes 1..39 at 100 tokens); the plugin's guard keeps it, in fairseq-train and here
    sizes = np.arange(1, 40, dtype=np.int64)
    samples, info = batches.train_batches(trainer, batches.pair_dataset(sizes, sizes, dictionary, 0), 100, 11,
                                            0, 8)
    assert info["batches_in_epoch"] == 11 and info["dropped_by_batch_by_size"] == 0 and info["too_long"] == 0
    assert sorted(int(i) for s in samples for i in s["id"]) == list(range(39))
    assert [len(s["id"]) for s in samples if 38 in s["id"]] == [1]


def test_an_update_is_fairseqs_trainer_step_with_adam():
    dictionary = make_dictionary(100)
    trainer = stock_trainer(dictionary)
    src, tgt, _ = batches.corpus_lengths(None, "train", 0)
    samples, _ = batches.train_batches(trainer, batches.pair_dataset(src, tgt, dictionary, 0), 97, 3, 0, 8)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    seconds, skipped = updates.run_updates(trainer, samples, torch.device("cpu"))
    assert seconds > 0 and skipped == 0 and trainer.get_num_updates() == 3
    assert type(trainer.optimizer).__name__ == "FairseqAdam"
    state = trainer.optimizer.optimizer.state
    assert all("exp_avg" in state[p] and "exp_avg_sq" in state[p] for p in trainer.model.parameters())
    changed = [not torch.equal(a, p.detach()) for a, p in zip(before, trainer.model.parameters())]
    assert sum(changed) >= len(changed) - 1, f"{len(changed) - sum(changed)} of {len(changed)} tensors unchanged"
    assert trainer.get_lr() > 0  # the schedule of configs/iwslt.args steps too


@pytest.mark.parametrize("times, seconds, expected", [
    ([3.0, 1.5, 1.02, 1.0, 0.5], 60, [3.0, 1.5, 1.02, 1.0]),  # stops at the first pass within 3% of the last
    ([1.0, 1.0], 0, []),  # --settle 0: nothing run
    ([2.0, 1.0, 2.0, 1.0, 2.0], 0.001, [2.0]),  # out of time after one pass (never settled)
])
def test_settle_runs_passes_until_two_agree(monkeypatch, times, seconds, expected):
    clock, ran = iter(range(1000)), []

    def fake_run(trainer, samples, device):
        ran.append(samples)
        return times[len(ran) - 1], 0

    monkeypatch.setattr(updates, "run_updates", fake_run)
    if seconds == 0.001:  # the clock: 0 at the start, then past the limit
        monkeypatch.setattr(updates.time, "perf_counter", lambda: next(clock))
    assert updates.settle(None, ["a", "b"], torch.device("cpu"), seconds) == expected
    assert all(s == ["a", "b"] for s in ran)


def test_updates_mode_json_and_table(tmp_path, capsys):
    out = tmp_path / "updates.json"
    warmup, block, asked = 2, 2, 3
    assert benchmark.main(["--mode", "updates", "--config", "tiny", "--configs", "no option", "M-10",
                           "--max-tokens", *map(str, SWEEP), "--updates", str(asked), "--block", str(block),
                           "--warmup", str(warmup), "--vocab", "300", "--decode-sentences", "5", "--decode-batch",
                           "2", "--decode-len", "12", "--min-pairs", "2", "--max-pairs", "2", "--threads", "1",
                           "--dtype", "bf16", "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    data = json.loads(out.read_text())
    timed = 4  # updates rounded up to a whole pair of blocks
    assert data["mode"] == "updates" and [b["max_tokens"] for b in data["batches"]] == SWEEP
    plain, m10 = data["configs"]
    # the batches the benchmark timed, made again: the tokens it reports are theirs
    dictionary = make_dictionary(296)
    trainer = stock_trainer(dictionary)
    src, tgt, _ = batches.corpus_lengths(None, "train", 0)
    dataset = batches.pair_dataset(src, tgt, dictionary, 0)
    for rec in (plain, m10):
        assert [u["max_tokens"] for u in rec["updates"]] == SWEEP
        for u in rec["updates"]:
            samples, _ = batches.train_batches(trainer, dataset, u["max_tokens"], warmup + timed, 0, 8)
            tokens = sum(int(s["ntokens"]) for s in samples[warmup:])
            assert u["settings"] == {"mode": "updates", "device": "cpu (1 threads)", "dtype": "bf16",
                                     "config": "tiny", "vocab": 300, "data": data["settings"]["data"],
                                     "updates": timed, "warmup": warmup, "block": block,
                                     "max_tokens": u["max_tokens"]}
            assert u["blocks"] == 2 and u["pairs"] == 1 and u["iqr"][0] <= u["ratio"] <= u["iqr"][1]
            # the one ratio is that of the pair of blocks (A B, then B A)
            assert u["ratio"] == pytest.approx(u["variant"]["seconds"] / u["stock"]["seconds"])
            for side in ("stock", "variant"):
                r = u[side]
                assert r["tgt_tokens"] == tokens and r["updates"] == timed and r["skipped"] == 0
                assert r["tokens_per_s"] * r["seconds"] == pytest.approx(tokens)
                assert r["seconds"] == pytest.approx(sum(r["block_seconds"]))
                assert r["tflops"] * 1e12 == pytest.approx(r["flops_per_update"] * timed / r["seconds"])
        g = rec["generate"]
        assert g["sentences"] == 5 and g["batches"] == 3 and g["settings"]["beam"] == 4 and g["steps"] == [12] * 3
        assert g["stock_tokens_per_s"] * g["stock_s"] == pytest.approx(g["tokens"])
    assert all(u["flops_ratio"] == 1.0 for u in plain["updates"])  # the stock model's arithmetic
    for u in m10["updates"]:  # M-10 attends every encoder layer: more FLOPs than stock
        assert u["flops_ratio"] > 1.0 and u["variant"]["flops_per_update"] > u["stock"]["flops_per_update"]
    assert m10["generate"]["flops_ratio"] > 1.0
    assert "speed = stock's time / the row's time" in stdout and "(1 / time ratio" in stdout
    assert "| M-10 | 61 |" in stdout and "| M-10 | 250 |" in stdout and "| row | 61 | 250 |" in stdout
    assert "0 by batch_by_size" in stdout and "synthetic sentence lengths" in stdout


def test_profile_of_updates_each_model_alone(tmp_path, capsys):
    """--profile train: the stock model and a row alone at each --max-tokens; the numbers are
    those of the batches fairseq-train makes, and hold together."""
    out = tmp_path / "profile.json"
    assert benchmark.main(["--mode", "updates", "--profile", "train", "--config", "tiny", "--configs", "M-10",
                           "--max-tokens", *map(str, SWEEP), "--updates", "3", "--block", "2", "--warmup", "2",
                           "--vocab", "300", "--threads", "1", "--device", "cpu", "--json", str(out)]) == 0
    data, stdout = json.loads(out.read_text()), capsys.readouterr().out
    assert [(r["model"], r["max_tokens"]) for r in data["rows"]] == [(m, t) for m in ("stock", "M-10") for t in SWEEP]
    dictionary = make_dictionary(296)
    src, tgt, _ = batches.corpus_lengths(None, "train", 0)
    dataset = batches.pair_dataset(src, tgt, dictionary, 0)
    for r in data["rows"]:
        samples, _ = batches.train_batches(stock_trainer(dictionary), dataset, r["max_tokens"], 2 + 4, 0, 8)
        assert r["updates"] == 4 and r["tgt_tokens_per_update"] == sum(int(s["ntokens"]) for s in samples[2:]) / 4
        assert r["tokens_per_s"] == pytest.approx(r["updates_per_s"] * r["tgt_tokens_per_update"])
        assert r["tflops"] * 1e12 == pytest.approx(r["flops_per_tgt_token"] * r["tokens_per_s"])
        # on a CPU: no kernels and no device time; the profiled host time is a real time
        assert r["kernels_per_update"] == 0 and r["device_ms_per_update"] == 0 and r["peak_gib"] is None
        assert r["host_ms_per_update_profiled"] > 0 and r["skipped"] == 0
    stock, m10 = data["rows"][0], data["rows"][len(SWEEP)]
    assert m10["flops_per_tgt_token"] > stock["flops_per_tgt_token"]  # M-10 attends every encoder layer
    assert "| stock | 61 |" in stdout and "| M-10 | 250 |" in stdout and "host syncs/update" in stdout


def test_every_row_of_the_thesis_overhead_list_runs_in_updates_mode(tmp_path, monkeypatch):
    """BASE_ROWS (DC, MMA, MS-4 included) by their names, at a tiny size with the 5 encoder
    layers MS-4 needs and the 4 heads MMA splits."""
    flags = list(TINY[2])
    flags[flags.index("--encoder-layers") + 1] = "5"
    for option in ("--encoder-attention-heads", "--decoder-attention-heads"):
        flags[flags.index(option) + 1] = "4"
    monkeypatch.setitem(measure.SIZES, "tiny", (TINY[0], TINY[1], flags))
    out = tmp_path / "rows.json"
    names = BASE_ROWS
    assert benchmark.main(["--mode", "updates", "--config", "tiny", "--configs", *names, "--max-tokens", "90",
                           "--updates", "1", "--block", "1", "--warmup", "1", "--vocab", "200",
                           "--decode-sentences", "0", "--threads", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["configs"]
    assert [r["name"] for r in rows] == names
    assert [r["flags"] for r in rows] == [ROWS[name] for name in BASE_ROWS]
    assert all("error" not in r and r["updates"][0]["variant"]["updates"] == 2 for r in rows), \
        [r.get("error") for r in rows]


@pytest.mark.parametrize("argv, message", [
    (["--max-tokens", "100"], "--max-tokens: with --mode updates only"),
    (["--mode", "updates", "--data", "/nonexistent"], "--data /nonexistent: not a directory"),
    (["--mode", "updates", "--configs", "M-99"], "--configs M-99: not a known row"),
    (["--mode", "updates", "--max-tokens", "0"], "--max-tokens 0: must be at least 1"),
    (["--mode", "updates", "--decode-len", "often"], "--decode-len often:"),
    (["--mode", "updates", "--profile", "decode"], "--profile decode: with --mode steps only"),
    (["--settle", "5"], "--settle: with --mode updates only"),
    (["--mode", "updates", "--settle", "-1"], "--settle -1.0: must be 0 (none) or more seconds"),
])
def test_errors_name_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        benchmark.main(argv + ["--device", "cpu"])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_a_max_tokens_no_pair_fits_is_refused(capsys):
    with pytest.raises(SystemExit):
        benchmark.main(["--mode", "updates", "--config", "tiny", "--max-tokens", "1", "--device", "cpu",
                        "--vocab", "200", "--configs", "no option"])
    assert "--max-tokens 1: no sentence pair of the data fits" in capsys.readouterr().err


def test_a_bad_vocab_or_row_flag_is_one_line_before_anything_runs(capsys):
    from fairseq_ext.errors import OptionError

    for argv, message in ((["--vocab", "-1"], "--vocab -1: must be at least 5"), (["--vocab", "0"], "--vocab 0: "),
                          (["--configs", "bad:--bogus 3"], "--configs bad:--bogus 3: unrecognized arguments: --bogus 3"),
                          (["--mode", "updates", "--configs", "M-10:--joint-attention m-22"],
                           "--joint-attention: invalid choice: 'm-22'")):
        with pytest.raises(OptionError, match=message) as refused:
            benchmark.main(["--config", "tiny", "--device", "cpu", *argv])
        assert "\n" not in str(refused.value)
    assert capsys.readouterr().out == ""  # no table started



def test_a_default_row_the_size_cannot_build_is_named_with_configs(capsys):
    """The default rows at --config tiny: MS-12+AIF's second auxiliary decoder needs 3 encoder layers."""
    from fairseq_ext.errors import OptionError

    for argv in (["--profile", "train"], []):
        with pytest.raises(OptionError) as refused:
            benchmark.main(["--config", "tiny", "--device", "cpu", *argv])
        assert str(refused.value) == ("--configs MS-12+AIF:--aux-decoder-layers 1,2 --aux-fusion: --aux-decoder-layers: "
                                      "layer 2 must be within 1..1 (below --encoder-layers 2; the main decoder reads "
                                      "layer 2) (at --config tiny)")
    assert capsys.readouterr().out == ""  # nothing ran
