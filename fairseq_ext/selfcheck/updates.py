"""``fairseq-ext benchmark --mode updates``: fairseq's training updates (``Trainer.train_step``:
forward, backward, Adam's step, in fp16 the loss scaler) of the stock Transformer and of each
row, interleaved on the same batches of real sentence lengths at each ``--max-tokens``, and
fairseq's beam search on sentences of the same data (docs/performance.md, "Training updates at
the papers' batch")."""
import json
import re
import shlex
import statistics
import time
from typing import List

import torch

from fairseq_ext.errors import OptionError
from fairseq_ext.model_builder import build_model, make_dictionary
from fairseq_ext.selfcheck.corpus_batches import corpus_lengths, decode_batches, pair_dataset, train_batches
from fairseq_ext.selfcheck.timing import (SIZES, flops, generate_fn, interleaved_ratio, quartiles, size_flags,
                                           sync)

# the optimizer, schedule and loss of configs/iwslt.args and configs/wmt14.args (the papers' training)
TRAIN_FLAGS = ["--share-all-embeddings", "--dropout", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
               "--adam-eps", "1e-9", "--clip-norm", "0.0", "--lr", "7e-4", "--lr-scheduler", "cosine",
               "--warmup-updates", "4000", "--warmup-init-lr", "1e-7", "--max-update", "200000",
               "--label-smoothing", "0.1", "--num-workers", "0"]
MAX_POSITIONS = {"base": 200}  # the configs' --max-source/target-positions; the other sizes 150 (iwslt.args)
STOCK_CRITERION, ROW_CRITERION = "label_smoothed_cross_entropy", "multi_output_label_smoothed_cross_entropy"
DEFAULT_MAX_TOKENS = {"base": 4960}  # the papers' batches: WMT 4,960 tokens, IWSLT 2,048


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
    """The defaults of this mode, and its options' values checked (errors name the option)."""
    from fairseq_ext.selfcheck.stages import BASE_ROWS

    if cli.profile:
        parser.error("--profile: with --mode steps only")
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
    """fairseq-train's flags of both models at ``--config``: the papers' optimizer, schedule,
    loss and maximum lengths, the size, the precision (``--cpu``, ``--fp16``, ``--bf16``)."""
    positions = str(MAX_POSITIONS.get(config, 150))
    return [*TRAIN_FLAGS, "--max-source-positions", positions, "--max-target-positions", positions,
            *size_flags(config), *dtype_flags]


def build_trainer(arch: str, flags, criterion: str, dictionary, seed: int):
    """fairseq's Trainer as fairseq-train sets it up (its parser on these flags, the translation
    task over ``dictionary``, the criterion, the optimizer and precision the flags name)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.tasks.translation import TranslationTask
    from fairseq.trainer import Trainer

    model, args = build_model(arch, *flags, "--criterion", criterion, "--seed", str(seed), dictionary=dictionary,
                              seed=seed)
    cfg = convert_namespace_to_omegaconf(args)
    task = TranslationTask(cfg.task, dictionary, dictionary)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def run_updates(trainer, samples, device):
    """Seconds for one ``Trainer.train_step`` per sample (the device synchronized around them),
    and how many of them fairseq skipped (an fp16 overflow: the loss scaler lowers its scale)."""
    sync(device)
    start = time.perf_counter()
    skipped = sum(trainer.train_step([sample]) is None for sample in samples)
    sync(device)
    return time.perf_counter() - start, skipped


def settle(trainer, samples, device, seconds: float, tolerance: float = 0.03) -> List[float]:
    """Untimed passes of ``trainer`` over ``samples`` until one takes within ``tolerance`` of the
    one before, or ``seconds`` have gone by: the seconds of each pass. On an H100 the stock
    model's first ~40 s of updates ran up to 3x slower than the same updates later, which made
    the first rows of a table wrong; one pass at least when ``seconds`` > 0."""
    passes: List[float] = []
    start = time.perf_counter()
    while seconds > 0:
        passes.append(run_updates(trainer, samples, device)[0])
        if (len(passes) > 1 and abs(passes[-1] - passes[-2]) <= tolerance * passes[-2]
                or time.perf_counter() - start >= seconds):
            break
    return passes


def interleaved_updates(stock, variant, samples, warmup: int, block: int, device) -> dict:
    """Both trainers run the same ``samples``: the first ``warmup`` under torch's FLOP counter
    and once more without it (untimed), then blocks of ``block`` updates, stock and row alternating in the order A B,
    B A, A B, ...: on a 2-core CPU in bf16 the model that ran first after the other one was 5-10%
    slower than when it ran second, so every pair of blocks (A B on some batches, B A on the
    next) gives one time ratio (row / stock) in which each model ran first once. The median
    of those ratios with its IQR, and per model its time, target tokens, tokens per second and
    achieved FLOP/s."""
    from torch.utils.flop_counter import FlopCounterMode

    warm, timed = samples[:warmup], samples[warmup:]
    warm_tokens = sum(int(s["ntokens"]) for s in warm)
    out = {}
    for name, trainer in (("stock", stock), ("variant", variant)):
        with FlopCounterMode(display=False) as counter:
            run_updates(trainer, warm, device)
        run_updates(trainer, warm, device)  # a new model's first plain updates (allocator, kernels)
        out[name] = {"flops_per_tgt_token": counter.get_total_flops() / warm_tokens, "block_seconds": [],
                     "skipped": 0}
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


def generate_all(model, batches, dictionary, beam):
    runs = [generate_fn(model, batch, dictionary, beam, steps) for batch, steps in batches]

    def run():
        for r in runs:
            r()

    return run


def interleaved_generate(stock_model, row_model, batches, dictionary, stock_flops: int, cli, device) -> dict:
    """fairseq's beam search over ``batches``, stock and row alternating by runs (as the steps
    mode times generation): the median time ratio with its IQR, output tokens per second and
    achieved FLOP/s of both (FLOPs of one run each, torch's counter)."""
    gen_stock = generate_all(stock_model, batches, dictionary, cli.beam)
    gen_row = generate_all(row_model, batches, dictionary, cli.beam)
    g = interleaved_ratio(gen_stock, gen_row, device, cli.min_pairs, cli.max_pairs, cli.seconds, cli.spread)
    row_flops = flops(gen_row)
    tokens = sum(int(b[1].numel()) * (steps + 1) for b, steps in batches)  # the forced steps and </s>
    g.update(beam=cli.beam, sentences=sum(int(b[1].numel()) for b, _ in batches), tokens=tokens,
             batches=len(batches), steps=[steps for _, steps in batches], stock_flops=stock_flops,
             variant_flops=row_flops, flops_ratio=row_flops / stock_flops,
             stock_tokens_per_s=tokens / g["stock_s"], variant_tokens_per_s=tokens / g["variant_s"],
             stock_tflops=stock_flops / g["stock_s"] / 1e12, variant_tflops=row_flops / g["variant_s"] / 1e12)
    return g


def speed_text(r) -> str:
    """A time ratio as a speed (1 / ratio) with the IQR turned the same way."""
    return f"{1 / r['ratio']:.2f} [{1 / r['iqr'][1]:.2f}-{1 / r['iqr'][0]:.2f}]"


def run(cli, parser, device) -> int:
    dtype_flags = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}[cli.dtype]
    dtype_flags += ["--cpu"] if device.type == "cpu" else []
    try:
        src_sizes, tgt_sizes, data_info = corpus_lengths(cli.data, cli.split, cli.seed)
    except ValueError as e:
        parser.error(str(e))
    dictionary = make_dictionary(cli.vocab - 4)
    stock_arch, arch, _ = SIZES[cli.config]
    common = train_flags(cli.config, dtype_flags)
    stock = build_trainer(stock_arch, common, STOCK_CRITERION, dictionary, cli.seed)
    dataset = pair_dataset(src_sizes, tgt_sizes, dictionary, cli.seed)
    blocks = 2 * -(-cli.updates // (2 * cli.block))  # pairs of blocks (A B, B A)
    needed = cli.warmup + blocks * cli.block
    sweep = {}
    for max_tokens in cli.max_tokens:
        try:
            sweep[max_tokens] = train_batches(stock, dataset, max_tokens, needed, cli.seed,
                                              cli.required_batch_size_multiple)
        except ValueError as e:
            parser.error(str(e))
    settle_s = cli.settle if cli.settle is not None else (60.0 if device.type == "cuda" else 0.0)
    passes = settle(stock, [s for samples, _ in sweep.values() for s in samples], device, settle_s)
    decoding = decode_batches(stock, src_sizes, tgt_sizes, dictionary, cli, device) if cli.decode_sentences else []
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"cpu ({torch.get_num_threads()} threads)")
    settings = {"mode": "updates", "device": device_name, "dtype": cli.dtype, "config": cli.config,
                "vocab": cli.vocab, "data": data_info["what"], "updates": blocks * cli.block, "warmup": cli.warmup,
                "block": cli.block}
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
            print(f"| {name} | {max_tokens} | {speed_text(r)} | {1 / r['flops_ratio']:.2f} | "
                  f"{r['stock']['tokens_per_s']:.0f} | {r['variant']['tokens_per_s']:.0f} | "
                  f"{r['stock']['tflops']:.3g} | {r['variant']['tflops']:.3g} | {r['sentences_per_batch']:.1f} | "
                  f"{r['stock']['skipped']}/{r['variant']['skipped']} |", flush=True)
            write_json(cli.json, results)
        if decoding:
            if stock_decode_flops is None:
                stock_decode_flops = flops(generate_all(stock.model, decoding, dictionary, cli.beam))
            g = interleaved_generate(stock.model, variant.model, decoding, dictionary, stock_decode_flops, cli, device)
            g["settings"] = {**settings, "beam": cli.beam, "decode_len": cli.decode_len}
            rec["generate"] = g
            decode_rows.append((name, g))
            write_json(cli.json, results)
        del variant
    if decode_rows:
        g0 = decode_rows[0][1]
        print(f"\nDecoding: fairseq's SequenceGenerator at beam {cli.beam}, {g0['sentences']} sentences of the data in "
              f"{g0['batches']} batches, each forced to --decode-len {cli.decode_len} steps; speed as above "
              "(median of interleaved runs [IQR]); tok/s = output tokens per second")
        print("| row | generate speed [IQR] | by FLOPs | stock tok/s | row tok/s | stock TFLOP/s | row TFLOP/s |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, g in decode_rows:
            print(f"| {name} | {speed_text(g)} | {1 / g['flops_ratio']:.2f} | {g['stock_tokens_per_s']:.0f} | "
                  f"{g['variant_tokens_per_s']:.0f} | {g['stock_tflops']:.3g} | {g['variant_tflops']:.3g} |")
    if len(cli.max_tokens) > 1:
        print("\nTraining speed by --max-tokens (1 / time ratio, median over the pairs of blocks)")
        print("| row | " + " | ".join(str(m) for m in cli.max_tokens) + " |")
        print("|---|" + "---:|" * len(cli.max_tokens))
        for rec in results["configs"]:
            speeds = [f"{1 / u['ratio']:.2f}" for u in rec.get("updates", [])] or ["–"] * len(cli.max_tokens)
            print(f"| {rec['name']} | " + " | ".join(speeds) + " |")
    return 0


def write_json(path, results) -> None:
    if path:  # after every row: a run stopped early keeps the rows it finished
        with open(path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
