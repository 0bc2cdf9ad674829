"""``--mode updates``: full training updates as fairseq-train runs them, at the papers' batches.

    fairseq-ext benchmark --mode updates --config small --vocab 32000 --max-tokens 480 2048 4960 16384 \\
        --data data-bin/iwslt15.en-vi --device cuda --dtype fp16 --json small.json
    fairseq-ext benchmark --mode updates --config base --max-tokens 4960 --data data-bin/wmt14.en-de \\
        --device cuda --dtype fp16 --json base.json

* an update is fairseq's own ``Trainer.train_step`` (forward, backward, Adam's step, in fp16
  fairseq's loss scaler; the optimizer, schedule and label smoothing of configs/iwslt.args), the
  stock model with fairseq's ``label_smoothed_cross_entropy``, the rows with the plugin's
  ``multi_output_label_smoothed_cross_entropy``;
* its batches are fairseq-train's: the sentence lengths of a corpus (``--data``: the split's
  sizes of a binarized data dir, or the word counts of two text files; without it a fixed
  distribution like IWSLT'15 En-Vi's), cut by fairseq's ``batch_by_size`` at each
  ``--max-tokens``, shuffled as an epoch; token ids random in a dictionary of ``--vocab`` words;
* stock and row run the same batches in blocks of ``--block`` updates, alternating A B, B A, ...,
  ``--updates`` each after ``--warmup``; the speed is the median of the ratios of each pair of
  blocks (stock's time / the row's) with its IQR; target tokens per second and achieved TFLOP/s
  (FLOPs of the warm-up updates per target token, torch's FLOP counter, times the tokens per
  second) of both;
* decoding: fairseq's SequenceGenerator at ``--beam`` on ``--decode-sentences`` sentences of the
  corpus in batches of ``--decode-batch`` (sorted by length as fairseq-generate batches them),
  each batch forced to ``--decode-len`` steps (fairseq_ext/selfcheck/updates.py).
"""
import glob
import gzip
import os
import re
import shlex
import statistics
import time
import unittest.mock
from typing import List

import numpy as np
import torch

from fairseq_ext.errors import OptionError
from fairseq_ext.model_builder import build_model, make_dictionary
from fairseq_ext.selfcheck.stage_files import table
from fairseq_ext.selfcheck.timing import (BASE_ROWS, SIZES, flops, generate_fn, interleaved_ratio, quartiles,
                                           size_flags, speed, sync, write_json)

# the optimizer, schedule and loss of configs/iwslt.args and configs/wmt14.args (the papers' training)
TRAIN_FLAGS = ["--share-all-embeddings", "--dropout", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
               "--adam-eps", "1e-9", "--clip-norm", "0.0", "--lr", "7e-4", "--lr-scheduler", "cosine",
               "--warmup-updates", "4000", "--warmup-init-lr", "1e-7", "--max-update", "200000",
               "--label-smoothing", "0.1", "--num-workers", "0"]
MAX_POSITIONS = {"base": 200}  # the configs' --max-source/target-positions; the other sizes 150 (iwslt.args)
STOCK_CRITERION, ROW_CRITERION = "label_smoothed_cross_entropy", "multi_output_label_smoothed_cross_entropy"
DEFAULT_MAX_TOKENS = {"base": 4960}  # the papers' batches: WMT 4,960 tokens, IWSLT 2,048
# without --data: lengths like IWSLT'15 En-Vi's train.en (log words: mean 2.87, sd 0.61; vi/en 1.22), + 1 for </s>
SYNTHETIC = {"sentences": 20000, "log_mean": 2.87, "log_sd": 0.61, "tgt_ratio": 1.22, "ratio_log_sd": 0.15}


def add_arguments(parser) -> None:
    up = parser.add_argument_group("--mode updates")
    up.add_argument("--max-tokens", type=int, nargs="+", metavar="N",
                    help="tokens a batch, as fairseq-train's --max-tokens; several values sweep every row over "
                         "them (default 4960 for --config base, else 2048)")
    up.add_argument("--data", nargs="+", metavar="PATH",
                    help="the sentence lengths: a binarized data dir (its --split's sizes) or two text files SRC "
                         "TGT (word counts + 1); default: a fixed synthetic distribution (see the description)")
    up.add_argument("--split", default="train", help="the split of a binarized --data dir (default train)")
    up.add_argument("--updates", type=int, default=100, help="timed updates of each model, rounded up to whole "
                                                              "pairs of blocks (default 100)")
    up.add_argument("--warmup", type=int, default=5, help="untimed updates of each model first, on which the FLOPs "
                                                          "are counted (default 5)")
    up.add_argument("--settle", type=float, metavar="SECONDS",
                    help="before the first row, the stock model trains untimed over every batch until two passes "
                         "take within 3%% of each other, for at most this long (default 60 on cuda, 0 on cpu): "
                         "a GPU's first tens of seconds ran the same updates up to 3x slower")
    up.add_argument("--block", type=int, default=5, help="updates a block: stock and row alternate by blocks, "
                                                         "A B then B A; each such pair gives a ratio (default 5)")
    up.add_argument("--required-batch-size-multiple", type=int, default=8,
                    help="as fairseq-train's (default 8, fairseq's)")
    up.add_argument("--decode-sentences", type=int, default=256,
                    help="sentences of the data decoded with beam search per run (0: no decoding; default 256)")
    up.add_argument("--decode-batch", type=int, default=64, help="sentences a decoding batch (default 64)")
    up.add_argument("--decode-len", default="target",
                    help="steps each decoding batch is forced to: target (its sentences' mean target length, "
                         "default), N (fixed), or Ax (A times their mean source length)")


def check_arguments(cli, parser) -> None:
    """The defaults of this mode, and its options' values checked."""
    if cli.profile == "decode":
        parser.error("--profile decode: with --mode steps only (--mode updates profiles training updates)")
    cli.vocab = cli.vocab or 32000
    cli.configs = BASE_ROWS if cli.configs is None else cli.configs
    cli.max_tokens = cli.max_tokens or [DEFAULT_MAX_TOKENS.get(cli.config, 2048)]
    if cli.settle is not None and cli.settle < 0:
        parser.error(f"--settle {cli.settle}: must be 0 (none) or more seconds")
    for option, value in (("--updates", cli.updates), ("--warmup", cli.warmup), ("--block", cli.block),
                          ("--required-batch-size-multiple", cli.required_batch_size_multiple),
                          ("--decode-batch", cli.decode_batch), ("--beam", cli.beam),
                          *(("--max-tokens", m) for m in cli.max_tokens)):
        if value < 1:
            parser.error(f"{option} {value}: must be at least 1")
    if cli.decode_sentences < 0:
        parser.error(f"--decode-sentences {cli.decode_sentences}: must be 0 (no decoding) or more")
    if not re.fullmatch(r"target|\d+|\d+(\.\d*)?x", cli.decode_len) or cli.decode_len in ("0", "0x"):
        parser.error(f"--decode-len {cli.decode_len}: give target, a number of steps N, or Ax (A times the "
                     "source length)")
    if len(set(cli.max_tokens)) != len(cli.max_tokens):
        parser.error(f"--max-tokens {' '.join(map(str, cli.max_tokens))}: a value twice")


def train_flags(config: str, dtype_flags) -> list:
    """fairseq-train's flags of both models: the papers' training, the size, the precision."""
    positions = str(MAX_POSITIONS.get(config, 150))
    return [*TRAIN_FLAGS, "--max-source-positions", positions, "--max-target-positions", positions,
            *size_flags(config), *dtype_flags]


def build_trainer(arch: str, flags, criterion: str, dictionary, seed: int):
    """fairseq's Trainer as fairseq-train sets it up, with the translation task over ``dictionary``."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.tasks.translation import TranslationTask
    from fairseq.trainer import Trainer

    model, args = build_model(arch, *flags, "--criterion", criterion, "--seed", str(seed), dictionary=dictionary,
                              seed=seed)
    cfg = convert_namespace_to_omegaconf(args)
    task = TranslationTask(cfg.task, dictionary, dictionary)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def run_updates(trainer, samples, device):
    """Seconds for one ``Trainer.train_step`` per sample, and how many fairseq skipped (fp16 overflows)."""
    sync(device)
    start = time.perf_counter()
    skipped = sum(trainer.train_step([sample]) is None for sample in samples)
    sync(device)
    return time.perf_counter() - start, skipped


def settle(trainer, samples, device, seconds: float, tolerance: float = 0.03) -> List[float]:
    """Untimed passes over ``samples`` until one takes within ``tolerance`` of the one before, or
    ``seconds`` have gone by (an H100 ran its first ~40 s up to 3x slower); the seconds of each."""
    passes: List[float] = []
    start = time.perf_counter()
    while seconds > 0:
        passes.append(run_updates(trainer, samples, device)[0])
        if (len(passes) > 1 and abs(passes[-1] - passes[-2]) <= tolerance * passes[-2]
                or time.perf_counter() - start >= seconds):
            break
    return passes


def interleaved_updates(stock, variant, samples, warmup: int, block: int, device) -> dict:
    """Both trainers run the same ``samples``: ``warmup`` updates under the FLOP counter and again
    untimed, then blocks of ``block`` updates alternating A B, B A, ... (the model that ran first was
    5-10% slower on a 2-core CPU), a time ratio per pair of blocks: their median with its IQR, and
    per model its time, tokens per second and achieved FLOP/s."""
    warm, timed = samples[:warmup], samples[warmup:]
    warm_tokens = sum(int(s["ntokens"]) for s in warm)
    out = {}
    for name, trainer in (("stock", stock), ("variant", variant)):
        counted = flops(lambda: run_updates(trainer, warm, device))
        run_updates(trainer, warm, device)  # a new model's first plain updates (allocator, kernels)
        out[name] = {"flops_per_tgt_token": counted / warm_tokens, "block_seconds": [], "skipped": 0}
    order = [("stock", stock), ("variant", variant)]
    for i in range(0, len(timed), block):
        for name, trainer in (order if (i // block) % 2 == 0 else order[::-1]):
            seconds, skipped = run_updates(trainer, timed[i: i + block], device)
            out[name]["block_seconds"].append(seconds)
            out[name]["skipped"] += skipped
    a, b = out["stock"]["block_seconds"], out["variant"]["block_seconds"]
    ratios = [(b[i] + b[i + 1]) / (a[i] + a[i + 1]) for i in range(0, len(a) - 1, 2)]
    tokens = sum(int(s["ntokens"]) for s in timed)
    for rec in out.values():
        rec["seconds"] = sum(rec["block_seconds"])
        rec.update(updates=len(timed), tgt_tokens=tokens, tokens_per_s=tokens / rec["seconds"],
                   updates_per_s=len(timed) / rec["seconds"],
                   flops_per_update=rec["flops_per_tgt_token"] * tokens / len(timed),
                   tflops=rec["flops_per_tgt_token"] * tokens / rec["seconds"] / 1e12)
    q1, q3 = quartiles(ratios)
    return {"ratio": statistics.median(ratios), "iqr": [q1, q3], "blocks": len(a), "pairs": len(ratios), **out,
            "flops_ratio": out["variant"]["flops_per_tgt_token"] / out["stock"]["flops_per_tgt_token"],
            "sentences_per_batch": sum(len(s["id"]) for s in timed) / len(timed),
            "src_tokens_per_batch": sum(int(s["net_input"]["src_lengths"].sum()) for s in timed) / len(timed),
            "tgt_tokens_per_batch": tokens / len(timed)}


def interleaved_generate(stock_model, row_model, batches, dictionary, stock_flops, cli, device) -> dict:
    """fairseq's beam search over ``batches``, stock and row alternating: the median time ratio with
    its IQR, tokens per second and FLOP/s of both (``stock_flops``: counted once, then passed in)."""
    gen_stock, gen_row = (generate_all(m, batches, dictionary, cli.beam) for m in (stock_model, row_model))
    stock_flops = stock_flops or flops(gen_stock)
    g = interleaved_ratio(gen_stock, gen_row, device, cli)
    row_flops = flops(gen_row)
    tokens = sum(int(b[1].numel()) * (steps + 1) for b, steps in batches)  # the forced steps and </s>
    g.update(beam=cli.beam, sentences=sum(int(b[1].numel()) for b, _ in batches), tokens=tokens,
             batches=len(batches), steps=[steps for _, steps in batches], stock_flops=stock_flops,
             variant_flops=row_flops, flops_ratio=row_flops / stock_flops,
             stock_tokens_per_s=tokens / g["stock_s"], variant_tokens_per_s=tokens / g["variant_s"],
             stock_tflops=stock_flops / g["stock_s"] / 1e12, variant_tflops=row_flops / g["variant_s"] / 1e12)
    return g


def generate_all(model, batches, dictionary, beam):
    runs = [generate_fn(model, batch, dictionary, beam, steps) for batch, steps in batches]
    return lambda: [r() for r in runs]


def run(cli, parser, device) -> int:
    try:
        src_sizes, tgt_sizes, data_info = corpus_lengths(cli.data, cli.split, cli.seed)
    except ValueError as e:
        parser.error(str(e))
    dictionary = make_dictionary(cli.vocab - 4)
    stock_arch, arch, _ = SIZES[cli.config]
    dtype_flags = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}[cli.dtype]
    common = train_flags(cli.config, dtype_flags + (["--cpu"] if device.type == "cpu" else []))
    stock = build_trainer(stock_arch, common, STOCK_CRITERION, dictionary, cli.seed)
    dataset = pair_dataset(src_sizes, tgt_sizes, dictionary, cli.seed)
    blocks = 2 * -(-cli.updates // (2 * cli.block))  # pairs of blocks (A B, B A)
    try:
        sweep = {m: train_batches(stock, dataset, m, cli.warmup + blocks * cli.block, cli.seed,
                                  cli.required_batch_size_multiple) for m in cli.max_tokens}
    except ValueError as e:
        parser.error(str(e))
    settle_s = cli.settle if cli.settle is not None else (60.0 if device.type == "cuda" else 0.0)
    passes = settle(stock, [s for samples, _ in sweep.values() for s in samples], device, settle_s)
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"cpu ({torch.get_num_threads()} threads)")
    if cli.profile:
        return profile_updates(cli, stock, sweep, common, dictionary, device, device_name, passes)
    decoding = decode_batches(stock, src_sizes, tgt_sizes, dictionary, cli, device) if cli.decode_sentences else []
    settings = {"mode": "updates", "device": device_name, "dtype": cli.dtype, "config": cli.config, "vocab": cli.vocab,
                "data": data_info["what"], "updates": blocks * cli.block, "warmup": cli.warmup, "block": cli.block}
    results = {"mode": "updates", "settings": {**vars(cli), **settings}, "data": {**data_info,
               "sentences": len(src_sizes), "src_tokens_mean": float(src_sizes.mean()),
               "tgt_tokens_mean": float(tgt_sizes.mean())},
               "batches": [info for _, info in sweep.values()],
               "stock": {"arch": stock_arch, "criterion": STOCK_CRITERION,
                         "params": sum(p.numel() for p in stock.model.parameters())},
               "settle_passes_s": [round(p, 3) for p in passes], "configs": []}
    print(f"device {device_name}, {cli.dtype}, {cli.config} config ({arch} vs stock {stock_arch}), vocab {cli.vocab}; "
          f"data: {data_info['what']}")
    if passes:
        print(f"settled: the stock model ran every batch untimed {len(passes)} times first (seconds a pass: "
              f"{', '.join(f'{p:.2f}' for p in passes)})")
    for info in results["batches"]:
        print(f"--max-tokens {info['max_tokens']}: {info['batches_in_epoch']} batches an epoch; left out: "
              f"{info['too_long']} pairs over {info['max_positions']} tokens, {info['dropped_by_batch_by_size']} "
              f"by batch_by_size (--required-batch-size-multiple {info['required_batch_size_multiple']}; the "
              "plugin keeps the last batch fairseq 0.12 drops)")
    print(f"fairseq's Trainer.train_step (Adam{', fp16 loss scaler' if cli.dtype == 'fp16' else ''}), "
          f"{blocks * cli.block} timed updates each after {cli.warmup} warm-up, in blocks of {cli.block} on the same "
          "batches, stock and row alternating A B, B A, ... speed = stock's time / the row's time for the same "
          "updates (1 / time ratio, as the thesis gives overheads): median over the pairs of blocks [IQR]; by "
          "FLOPs = stock's FLOPs / the row's; tok/s = target tokens per second; TFLOP/s achieved")
    print("| row | max tokens | speed [IQR] | by FLOPs | stock tok/s | row tok/s | stock TFLOP/s | row TFLOP/s | "
          "sentences/batch | skipped (stock/row) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    stock_decode_flops, decode_rows = None, []
    for entry in cli.configs:
        name, _, flags = entry.partition(":")
        try:
            variant = build_trainer(arch, common + shlex.split(flags), ROW_CRITERION, dictionary, cli.seed)
        except OptionError as e:  # e.g. MS-4 (an auxiliary decoder on layer 4) below 5 encoder layers
            results["configs"].append({"name": name, "flags": flags, "error": str(e)})
            print(f"| {name} | – | not built at the {cli.config} config: {e} |", flush=True)
            write_json(cli.json, results)
            continue
        rec = {"name": name, "flags": flags, "arch": arch, "criterion": ROW_CRITERION,
               "params": sum(p.numel() for p in variant.model.parameters()), "updates": []}
        results["configs"].append(rec)
        for max_tokens, (samples, _) in sweep.items():
            r = interleaved_updates(stock, variant, samples, cli.warmup, cli.block, device)
            rec["updates"].append({"max_tokens": max_tokens, "settings": {**settings, "max_tokens": max_tokens}, **r})
            print(f"| {name} | {max_tokens} | {speed(r)} | {1 / r['flops_ratio']:.2f} | "
                  f"{r['stock']['tokens_per_s']:.0f} | {r['variant']['tokens_per_s']:.0f} | "
                  f"{r['stock']['tflops']:.3g} | {r['variant']['tflops']:.3g} | {r['sentences_per_batch']:.1f} | "
                  f"{r['stock']['skipped']}/{r['variant']['skipped']} |", flush=True)
            write_json(cli.json, results)
        if decoding:
            g = interleaved_generate(stock.model, variant.model, decoding, dictionary, stock_decode_flops, cli, device)
            stock_decode_flops = g["stock_flops"]
            rec["generate"] = {**g, "settings": {**settings, "beam": cli.beam, "decode_len": cli.decode_len}}
            decode_rows.append((name, g))
            write_json(cli.json, results)
        del variant
    if decode_rows:
        print(f"\nDecoding: fairseq's SequenceGenerator at beam {cli.beam}, {decode_rows[0][1]['sentences']} sentences "
              f"of the data in {decode_rows[0][1]['batches']} batches, each forced to --decode-len {cli.decode_len} "
              "steps; speed as above (median of interleaved runs [IQR]); tok/s = output tokens per second")
        print("\n".join(table(["row", "generate speed [IQR]", "by FLOPs", "stock tok/s", "row tok/s", "stock TFLOP/s",
                               "row TFLOP/s"],
                              [[name, speed(g), f"{1 / g['flops_ratio']:.2f}", f"{g['stock_tokens_per_s']:.0f}",
                                f"{g['variant_tokens_per_s']:.0f}", f"{g['stock_tflops']:.3g}",
                                f"{g['variant_tflops']:.3g}"] for name, g in decode_rows])))
    if len(cli.max_tokens) > 1:
        print("\nTraining speed by --max-tokens (1 / time ratio, median over the pairs of blocks)")
        print("\n".join(table(["row", *map(str, cli.max_tokens)], [
            [rec["name"], *([f"{1 / u['ratio']:.2f}" for u in rec.get("updates", [])] or [None] * len(cli.max_tokens))]
            for rec in results["configs"]])))
    return 0


# the CUDA runtime calls that make the host wait for the device
HOST_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def profile_updates(cli, stock, sweep, common, dictionary, device, device_name: str, passes) -> int:
    """``--profile train``: each model alone (the stock, then every --configs row) at every
    --max-tokens: its updates timed plainly (updates/s, target tokens/s, TFLOP/s, peak memory),
    then the same updates under torch.profiler (host and device time, kernels and host syncs per
    update)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    models = [("stock", stock)] + [(e.partition(":")[0], build_trainer(SIZES[cli.config][1], common + shlex.split(
        e.partition(":")[2]), ROW_CRITERION, dictionary, cli.seed)) for e in cli.configs]
    results = {"mode": "updates-profile", "settings": vars(cli), "device": device_name,
               "settle_passes_s": [round(p, 3) for p in passes], "rows": []}
    header = ["model", "max tokens", "tgt tokens/update", "updates/s", "tgt tokens/s", "TFLOP/s", "peak GiB",
              "host ms/update (profiled)", "device ms/update", "kernels/update", "host syncs/update"]
    print(f"{results['device']}, {cli.dtype}, {cli.config} config, vocab {cli.vocab}: each model alone, {cli.warmup} "
          f"warm-up updates (FLOPs counted), {len(next(iter(sweep.values()))[0]) - cli.warmup} timed, the same again "
          f"profiled; first the stock model ran every batch untimed {len(passes)} times (seconds a pass: "
          f"{', '.join(f'{p:.2f}' for p in passes) or 'none'})")
    print("| " + " | ".join(header) + " |\n|---|" + "---:|" * (len(header) - 1), flush=True)
    for name, trainer in models:
        for max_tokens, (samples, _) in sweep.items():
            warm, timed_samples = samples[:cli.warmup], samples[cli.warmup:]
            tokens = sum(int(s["ntokens"]) for s in timed_samples)
            per_token = flops(lambda: run_updates(trainer, warm, device)) / sum(int(s["ntokens"]) for s in warm)
            run_updates(trainer, warm, device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            # fairseq's Trainer resets the peak after every update (its gb_free): not while timed here
            with unittest.mock.patch.object(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None):
                seconds, skipped = run_updates(trainer, timed_samples, device)
            with torch_profile(activities=activities) as prof:
                profiled_s, _ = run_updates(trainer, timed_samples, device)
            events, n = prof.events(), len(timed_samples)
            kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
            row = {"model": name, "max_tokens": max_tokens, "updates": n, "skipped": skipped,
                   "tgt_tokens_per_update": tokens / n, "updates_per_s": n / seconds, "tokens_per_s": tokens / seconds,
                   "flops_per_tgt_token": per_token, "tflops": per_token * tokens / seconds / 1e12,
                   "peak_gib": torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None,
                   "host_ms_per_update_profiled": 1e3 * profiled_s / n,
                   "device_ms_per_update": sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / n,
                   "kernels_per_update": len(kernels) / n,
                   "host_syncs_per_update": sum(e.name in HOST_SYNCS for e in events) / n}
            results["rows"].append(row)
            cells = [name, max_tokens, f"{row['tgt_tokens_per_update']:.0f}", f"{row['updates_per_s']:.1f}",
                     f"{row['tokens_per_s']:.0f}", f"{row['tflops']:.3g}",
                     "–" if row["peak_gib"] is None else f"{row['peak_gib']:.2f}",
                     f"{row['host_ms_per_update_profiled']:.1f}", f"{row['device_ms_per_update']:.1f}",
                     f"{row['kernels_per_update']:.0f}", f"{row['host_syncs_per_update']:.1f}"]
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)
            write_json(cli.json, results)
    return 0


def corpus_lengths(data, split: str, seed: int):
    """(source sizes, target sizes, description) with </s>, of ``data``: None (synthetic), [DIR] (its
    ``split``'s sizes) or [SRC, TGT] (text files, .gz allowed: word counts + 1)."""
    if not data:
        rng = np.random.default_rng(seed)
        n = SYNTHETIC["sentences"]
        words = np.clip(np.rint(np.exp(rng.normal(SYNTHETIC["log_mean"], SYNTHETIC["log_sd"], n))), 1, 148)
        ratio = SYNTHETIC["tgt_ratio"] * np.exp(rng.normal(0, SYNTHETIC["ratio_log_sd"], n))
        tgt = np.clip(np.rint(words * ratio), 1, 148)
        return (words + 1).astype(np.int64), (tgt + 1).astype(np.int64), {
            "kind": "synthetic", "what": f"no --data: {n} synthetic sentence lengths like IWSLT'15 En-Vi's "
                                        f"tokenized text (log words ~ N({SYNTHETIC['log_mean']}, "
                                        f"{SYNTHETIC['log_sd']}), target {SYNTHETIC['tgt_ratio']}x), + 1 for </s>"}
    if len(data) == 1:
        folder = data[0]
        if not os.path.isdir(folder):
            raise ValueError(f"--data {folder}: not a directory (give a binarized data dir, or SRC TGT text files)")
        pairs = sorted({m.groups() for f in glob.glob(os.path.join(folder, f"{split}.*-*.*.idx"))
                        if (m := re.fullmatch(rf"{re.escape(split)}\.([^.-]+)-([^.-]+)\.[^.]+\.idx",
                                              os.path.basename(f)))})
        if len(pairs) != 1:
            found = ": " + ", ".join("-".join(p) for p in pairs) if pairs else ""
            raise ValueError(f"--data {folder}: {'no' if not pairs else 'more than one'} binarized {split} split "
                             f"({split}.SRC-TGT.SRC.idx){found}")
        from fairseq.data import data_utils

        src_lang, tgt_lang = pairs[0]
        sizes = []
        for lang in (src_lang, tgt_lang):
            dataset = data_utils.load_indexed_dataset(os.path.join(folder, f"{split}.{src_lang}-{tgt_lang}.{lang}"))
            if dataset is None:
                raise ValueError(f"--data {folder}: cannot read {split}.{src_lang}-{tgt_lang}.{lang}")
            sizes.append(np.asarray(dataset.sizes, dtype=np.int64))
        return sizes[0], sizes[1], {"kind": "binarized", "what": f"{folder}: the {split} split's {src_lang}-{tgt_lang} "
                                                                 "sizes (fairseq's tokens, </s> included)"}
    if len(data) == 2:
        counts = []
        for path in data:
            if not os.path.isfile(path):
                raise ValueError(f"--data {path}: no such file")
            with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
                counts.append(np.fromiter((len(line.split()) + 1 for line in f), dtype=np.int64))
        if len(counts[0]) != len(counts[1]):
            raise ValueError(f"--data {data[0]} {data[1]}: {len(counts[0])} and {len(counts[1])} lines")
        return counts[0], counts[1], {"kind": "text", "what": f"{data[0]} / {data[1]}: whitespace word counts + 1 "
                                                              "for </s>, a proxy for fairseq's tokens (BPE makes "
                                                              "sentences longer)"}
    raise ValueError("--data: one binarized data dir, or two text files SRC TGT")


class RandomTokens:
    """A sentence per size of random word ids, </s> last, the same for an index every time."""

    def __init__(self, sizes, dictionary, seed: int):
        self.sizes, self.seed = sizes, seed
        self.low, self.high, self.eos = dictionary.nspecial, len(dictionary), dictionary.eos()

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, index):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(index))
        tokens = torch.randint(self.low, self.high, (int(self.sizes[index]),), generator=g)
        tokens[-1] = self.eos
        return tokens


def pair_dataset(src_sizes, tgt_sizes, dictionary, seed: int, shuffle: bool = True):
    """fairseq's LanguagePairDataset over random tokens of these sizes."""
    from fairseq.data import LanguagePairDataset

    return LanguagePairDataset(RandomTokens(src_sizes, dictionary, seed), src_sizes, dictionary,
                               RandomTokens(tgt_sizes, dictionary, seed + 1), tgt_sizes, dictionary,
                               left_pad_source=True, left_pad_target=False, shuffle=shuffle)


def train_batches(trainer, dataset, max_tokens: int, count: int, seed: int, multiple: int):
    """The first ``count`` batches fairseq-train makes of ``dataset`` at ``max_tokens`` (epochs
    repeated), as ``Trainer.get_train_iterator`` makes them, and what the batching left out
    (``dropped_by_batch_by_size``: fairseq 0.12's, which the plugin's guard keeps)."""
    from fairseq import utils

    task = trainer.task
    max_positions = utils.resolve_max_positions(task.max_positions(), trainer.model.max_positions(), max_tokens)
    src, tgt = dataset.src_sizes, dataset.tgt_sizes
    too_long = int(((src > max_positions[0]) | (tgt > max_positions[1])).sum())
    if too_long == len(src):
        raise ValueError(f"--max-tokens {max_tokens}: no sentence pair of the data fits (every one is longer "
                         f"than {tuple(max_positions)} tokens)")
    itr = task.get_batch_iterator(dataset, max_tokens=max_tokens, max_positions=max_positions,
                                  ignore_invalid_inputs=True, required_batch_size_multiple=multiple, seed=seed,
                                  epoch=1, disable_iterator_cache=True)
    batched = sum(len(b) for b in itr.frozen_batches)
    info = {"max_tokens": max_tokens, "max_positions": list(max_positions), "sentences": len(src),
            "too_long": too_long, "dropped_by_batch_by_size": len(src) - too_long - batched,
            "batches_in_epoch": len(itr.frozen_batches), "required_batch_size_multiple": multiple}
    samples = []
    while len(samples) < count:
        for sample in itr.next_epoch_itr(shuffle=True):
            samples.append(sample)
            if len(samples) == count:
                break
    return samples, info


def decode_batches(trainer, src_sizes, tgt_sizes, dictionary, cli, device):
    """``--decode-sentences`` random pairs batched as fairseq-generate batches a test set:
    [((src_tokens, src_lengths, None), steps of ``--decode-len``)]."""
    max_positions = trainer.task.max_positions()
    fits = np.flatnonzero((src_sizes <= max_positions[0]) & (tgt_sizes <= max_positions[1] - 1))
    chosen = np.random.default_rng(cli.seed).choice(fits, min(cli.decode_sentences, len(fits)), replace=False)
    dataset = pair_dataset(src_sizes[chosen], tgt_sizes[chosen], dictionary, cli.seed + 7, shuffle=False)
    itr = trainer.task.get_batch_iterator(dataset, max_sentences=cli.decode_batch, disable_iterator_cache=True)
    batches = []
    for sample in itr.next_epoch_itr(shuffle=False):
        ids, net, spec = sample["id"].numpy(), sample["net_input"], cli.decode_len
        if spec == "target":
            steps = float(dataset.tgt_sizes[ids].mean()) - 1
        elif spec.endswith("x"):
            steps = float(spec[:-1]) * (float(dataset.src_sizes[ids].mean()) - 1)
        else:
            steps = int(spec)
        batches.append(((net["src_tokens"].to(device), net["src_lengths"].to(device), None), max(1, round(steps))))
    return batches
