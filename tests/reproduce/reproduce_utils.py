"""What several test files of the reproduce runner share: hand-made run directories (a
smoke-scale model, a data directory's prep.env, the runs of a table trained with several
seeds) and the ``--report`` command line over them."""
import json
import os

from fairseq_ext.reproduce import __main__ as cli
from fairseq_ext.reproduce import planning
from fairseq_ext.reproduce.tables import load_setups, load_table

SMOKE_MODEL = {"encoder_layers": 6, "decoder_layers": 6, "encoder_embed_dim": 64, "encoder_ffn_embed_dim": 128,
               "encoder_attention_heads": 4}
PREP_ENV = "src=en\ntgt=de\ntest_set=test_2016_flickr\ntest_pairs=1000\ntrain_pairs=3000\n"


def report_cli(tmp_path, *argv):
    return cli.main([*argv, "--report", "--smoke", "--work-dir", str(tmp_path / "runs"),
                     "--data-root", str(tmp_path / "data")])


SEEDS = [1, 2, 3]
# mma-4, BLEU per row and seed
BLEU = {"transformer": {1: 30.0, 2: 29.5, 3: 30.25},
        "plus-mma": {1: 31.0, 2: 30.0, 3: 31.5},  # above at every seed, significant at every seed
        "plus-local-attention": {1: 30.75, 2: 30.5, 3: 31.0},  # above at every seed, seed 2 not significant
        "plus-forward-attention": {1: 30.5, 2: 29.0, 3: 30.75},  # significant at every seed, seed 2 below
        "plus-backward-attention": {1: 29.75, 2: 29.25, 3: 29.75}}
# (p, mark) of each seed's paired bootstrap against the transformer of the same seed (the MMA paper's marks)
SIG = {"plus-mma": {1: (0.001, "††"), 2: (0.03, "†"), 3: (0.002, "††")},
       "plus-local-attention": {1: (0.01, "†"), 2: (0.2, ""), 3: (0.004, "††")},
       "plus-forward-attention": {1: (0.02, "†"), 2: (0.01, "†"), 3: (0.03, "†")},
       "plus-backward-attention": {1: (0.3, ""), 2: (0.4, ""), 3: (0.2, "")}}


def options(tmp_path):
    return planning.Options(work_dir=str(tmp_path / "runs"), data_root=str(tmp_path / "data"), smoke=True,
                            budget="60", cpu=True)


def write_seed_runs(by_seed, bleu, **result):
    """A finished run (prep.env, result.json with ``bleu(row, seed)`` and ``result``) for every
    planned run of every seed."""
    for seed, plans in by_seed.items():
        for p in plans:
            os.makedirs(p.run_dir, exist_ok=True)
            os.makedirs(p.data_dir, exist_ok=True)
            with open(os.path.join(p.data_dir, "prep.env"), "w") as f:
                f.write(PREP_ENV)
            with open(os.path.join(p.run_dir, "result.json"), "w") as f:
                json.dump({"plan": p.result_key(), "model": SMOKE_MODEL, "updates": 60, "planned_updates": 60,
                           "bleu": bleu(p.row, seed), **result}, f)


def make_seed_runs(tmp_path, table_id="mma-4", seeds=SEEDS):
    """Finished runs of mma-4 at smoke scale for every seed: result.json and significance.json."""
    table = load_table(table_id)
    by_seed = planning.plan_seeds(table, table.select(None), load_setups(), options(tmp_path), seeds)
    write_seed_runs(by_seed, lambda row, seed: BLEU[row][seed])
    for seed, plans in by_seed.items():
        for p in plans:
            if p.row in SIG:
                p_value, mark = SIG[p.row][seed]
                with open(os.path.join(p.run_dir, "significance.json"), "w") as f:
                    json.dump({"baseline": "transformer", "p_value": p_value, "mark": mark}, f)
    return by_seed
