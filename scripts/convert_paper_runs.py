"""The paper stage's runs made by its earlier runner (FOLDER/paper/runs/NAME/run.json, the layout of
docs/benchmarks/paper-*) into the table runner's layout, then their tables rendered by the runner's one table writer
(`fairseq-ext reproduce ... --report`) into FOLDER/paper.md.

    python scripts/convert_paper_runs.py docs/benchmarks/paper-iwslt15-en-vi-h200

Each run keeps its numbers (BLEU, chrF, translations, logs) and is put where `fairseq-ext reproduce` with the same
settings puts its run: 32,768 tokens a batch as `--share` (updates x tokens over the thesis' 200,000 x 2,048), any
other batch as `--budget UPDATES` with the batch, learning rate and warm-up in `--train-args`; the flags it trained
with beyond those (fp16, the validation interval) in `--train-args` too. Its result.json records what it was converted
from (the run.json, the command that trained it). The earlier runner evaluated checkpoint_last.pt and the table runner
evaluates checkpoint_best.pt: a run is converted only where its last validation was its best (from its train.log),
so that both are the one checkpoint. The parameter count and the model's shape are those its flags build at the
pack's vocabulary (the checkpoints are not stored)."""
import argparse
import json
import os
import re
import shlex
import shutil
import sys

from fairseq_ext.reproduce import __main__ as cli
from fairseq_ext.reproduce import execute, params
from fairseq_ext.reproduce.planning import write_json
from fairseq_ext.reproduce.tables import load_setups, load_table

THESIS_TOKENS = 200_000 * 2_048
SCHEDULE = {"--lr-scheduler": 1, "--warmup-init-lr": 1, "--no-epoch-checkpoints": 0, "--log-interval": 1}  # as iwslt.args
SETTINGS = ("--seed", "--max-update", "--max-tokens", "--lr", "--warmup-updates", "--source-lang", "--target-lang")
FIRST = {"iter-c-agg": "--joint-attention iter-c-agg", "transformer": ""}  # run.json of the first version: no "flags"


def valid_losses(log: str):
    found = []
    for line in open(log, encoding="utf-8", errors="replace"):
        m = re.search(r"valid on 'valid' subset \|.*?\bloss ([0-9.]+).*?\bnum_updates (\d+)", line)
        if m:
            found.append((int(m.group(2)), float(m.group(1))))
    return found


def extra_flags(command, row_flags):
    """What the run trained with beyond its row's flags, its settings and the earlier runner's schedule flags."""
    flags, out, i = command[command.index("--") + 1:], [], 0
    row = shlex.split(row_flags)
    while i < len(flags):
        if flags[i:i + len(row)] == row and row:
            i, row = i + len(row), []
        elif flags[i] in SETTINGS:
            i += 2
        elif flags[i] in SCHEDULE:
            i += 1 + SCHEDULE[flags[i]]
        else:
            out.append(flags[i])
            i += 1
    return out


def reproduce_argv(record, folder, data):
    updates, tokens, lr, warmup = (record[k] for k in ("updates_planned", "max_tokens", "lr", "warmup"))
    extra = extra_flags(record["train_command"], "--arch multilayer_transformer_iwslt " + record["flags"])
    if tokens == 32768:  # the runner's --share rule, with what differs from it
        share = updates * tokens / THESIS_TOKENS
        schedule = ["--share", f"{share:g}"]
        extra += [] if lr == 1e-3 else ["--lr", f"{lr:g}"]
        extra += [] if warmup == min(400, updates // 4) else ["--warmup-updates", str(warmup)]
    else:
        schedule = ["--budget", str(updates)]
        extra += ["--max-tokens", str(tokens), "--lr", f"{lr:g}", "--warmup-updates", str(warmup)]
    return ["thesis-3.3" if record["dataset"] == "iwslt15-en-vi" else "thesis-5.3", "--datasets", record["dataset"],
            "--seeds", str(record["seed"]), *schedule, "--prepared", f"{record['dataset']}={data}", "--devices", "0",
            "--test", "ar", "--work-dir", os.path.join(folder, "paper"), f"--train-args={shlex.join(extra)}",
            "--generate-args=--fp16"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    folder = ap.parse_args().folder
    runs = os.path.join(folder, "paper", "runs")
    data = os.path.join(folder, "paper", "data", "iwslt15.en-vi")
    setups, groups = load_setups(), {}
    for name in sorted(os.listdir(runs)):
        record = json.load(open(os.path.join(runs, name, "run.json"), encoding="utf-8"))
        record.setdefault("dataset", "iwslt15-en-vi")
        record.setdefault("flags", "--arch multilayer_transformer_iwslt " + FIRST[record["row"]])
        record["flags"] = record["flags"].replace("--arch multilayer_transformer_iwslt", "").strip()
        losses = valid_losses(os.path.join(runs, name, "train.log"))
        if not losses or losses[-1][0] != record["updates"] or losses[-1][1] > min(loss for _, loss in losses):
            sys.exit(f"{name}: its last validation is not its best ({losses[-3:]}): its checkpoint_last.pt is not the "
                     "runner's checkpoint_best.pt")
        if not os.path.exists(os.path.join(data, "prep.env")):  # what the pack's prep.env held, as run.json says
            os.makedirs(data)
            ref = open(os.path.join(runs, name, "eval-test", "ref.detok"), encoding="utf-8").read().splitlines()
            with open(os.path.join(data, "prep.env"), "w", encoding="utf-8") as f:
                f.write(f"recipe=iwslt15-en-vi\nsrc=en\ntgt=vi\nbpe=subword_nmt\nbpe_merges={record['bpe_merges']}\n"
                        f"lowercase=0\nvalid_set=tst2012\ntest_set={record['test_set']}\ntest_pairs={len(ref)}\n"
                        f"dict_size={record['dict_size']}\n")
        argv = reproduce_argv(record, folder, data)
        table = load_table(argv[0], setups=setups)
        row = next(r for r in table.rows if r.runnable and r.flags[2:] == shlex.split(record["flags"]))
        args = cli.build_parser().parse_args(argv + ["--rows", row.id])
        args.cpu = False  # trained and evaluated on a GPU, as the runner plans it there
        todo = cli.plan(table, args, setups, [record["seed"]])
        plan = next(p for p in todo.plans if p.row == row.id)
        shutil.rmtree(plan.run_dir, ignore_errors=True)  # (converted again: the same files)
        os.makedirs(plan.run_dir)
        for part in ("eval-test", "train.log", "evaluate.log"):
            source, target = os.path.join(runs, name, part), os.path.join(plan.run_dir, part)
            (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, target)
        write_json(os.path.join(plan.run_dir, "plan.json"), plan.as_json())
        write_json(os.path.join(plan.run_dir, "result.json"), {
            "plan": plan.result_key(), "bleu": record["bleu"], "params": params.count(plan.model_flags,
                                                                                     int(record["dict_size"]) + 4),
            "model": params.shape(plan.model_flags), "train_seconds": record["train_wall_s"], "updates":
            record["updates"], "planned_updates": record["updates_planned"], "train_ups": record["train_ups"],
            "train_wps": record.get("train_wps"), **execute.decoding_speed(os.path.join(plan.run_dir, "eval-test")),
            "converted_from": {"run.json": os.path.relpath(os.path.join(runs, name, "run.json"), folder),
                               "train_command": record["train_command"], "generate": record["generate"],
                               "evaluated": "checkpoint_last.pt, the best by validation loss", "device":
                               record["device"], "concurrent_runs": record["concurrent_runs"]}})
        key = tuple(argv[:argv.index("--seeds") + 1] + argv[argv.index("--seeds") + 2:])
        groups.setdefault(key, (argv, set(), set()))[1].add(row.id)
        groups[key][2].add(record["seed"])
        print(f"{name} -> {plan.run_dir}")
    pages = []
    for argv, rows, seeds in groups.values():
        argv = [*argv, "--rows", ",".join(sorted(rows)), "--report"]  # (the header's device: the CPU's, where rendered)
        argv[argv.index("--seeds") + 1] = ",".join(map(str, sorted(seeds)))
        written = []
        cli.main(argv, written)
        pages.append(f"`fairseq-ext reproduce {shlex.join(argv)}`\n\n" + open(written[0], encoding="utf-8").read())
    with open(os.path.join(folder, "paper.md"), "w", encoding="utf-8") as f:
        f.write("# Thesis Table 3.3 on one GPU: IWSLT'15 En→Vi\n\nThe runs of paper/runs/ (the paper stage's earlier "
                "records, run.json), in the table runner's layout (paper/thesis-3.3/, by scripts/convert_paper_runs.py), "
                "each table written by the runner with the command above it.\n\n" + "\n\n".join(pages))


if __name__ == "__main__":
    main()
