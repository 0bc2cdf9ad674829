#!/usr/bin/env python
"""Speed and memory of fairseq_ext configurations as ratios against the stock fairseq
Transformer, measured in the same run on the same batches.

    python scripts/benchmark.py                                   # small config, CPU or GPU
    python scripts/benchmark.py --arch multilayer_transformer_wmt_en_de --batch 64 --fp16   # on a GPU
    python scripts/benchmark.py --configs "m-00:--joint-attention m-00" "MS-1:--aux-decoder-layers 1"

For each configuration: training step time (forward + backward of a teacher-forced batch),
beam-search decoding time through fairseq's SequenceGenerator, parameter count and, on
CUDA, peak memory of the training step. Times are medians over --repeats runs; the stock
model is measured again right before every configuration and each ratio comes from that
pair, so that load from other processes on the machine drifts out of the ratios.
"""
import argparse
import logging
import shlex
import statistics
import time

import torch
from fairseq.sequence_generator import SequenceGenerator

from fairseq_ext import keys
from fairseq_ext.model_builder import build_model, make_dictionary

DEFAULT_CONFIGS = [
    "S-Agg:--joint-attention s-agg",
    "C-Agg:--joint-attention c-agg",
    "transparent:--joint-attention transparent",
    "M-00:--joint-attention m-00",
    "M-11:--joint-attention m-11",
    "serial:--joint-attention serial",
    "flat:--joint-attention flat",
    "MS-1 (main decoder only at inference):--aux-decoder-layers 1",
    "MS-1+AIF:--aux-decoder-layers 1 --aux-fusion",
    "Enc-DC:--encoder-self-attention dc",
    "Dec-DC:--decoder-self-attention dc",
    "MMA:--encoder-self-attention mma",
]


def build(arch, flags, dictionary):
    model, _ = build_model(arch, "--share-all-embeddings", "--dropout", "0.1", *flags, dictionary=dictionary)
    return model


def median_time(fn, repeats, device):
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def measure(model, batch, dictionary, cli, device, dtype):
    model = model.to(device=device, dtype=dtype)
    src, lengths, prev = batch

    def train_step():
        model.train()
        model.zero_grad()
        logits, extra = model(src, lengths, prev)
        loss = logits.float().logsumexp(-1).mean()
        for aux in extra.get(keys.AUX_OUT) or []:
            loss = loss + aux.float().logsumexp(-1).mean()
        loss.backward()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train = median_time(train_step, cli.repeats, device)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else float("nan")
    model.eval()
    generator = SequenceGenerator([model], dictionary, beam_size=cli.beam, max_len_a=1.2, max_len_b=10)
    sample = {"net_input": {"src_tokens": src[: cli.decode_batch], "src_lengths": lengths[: cli.decode_batch]}}
    with torch.no_grad():
        decode = median_time(lambda: generator.forward(sample), cli.repeats, device)
    params = sum(p.numel() for p in model.parameters())
    model.to("cpu")
    return train, decode, peak, params


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="multilayer_transformer_iwslt")
    parser.add_argument("--configs", nargs="*", default=DEFAULT_CONFIGS, help="NAME:FLAGS entries")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--tgt-len", type=int, default=30)
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpu", action="store_true", help="benchmark on the CPU even if CUDA is available")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    cli = parser.parse_args()
    logging.disable(logging.WARNING)
    device = torch.device("cuda" if torch.cuda.is_available() and not cli.cpu else "cpu")
    dtype = torch.float16 if cli.fp16 else torch.bfloat16 if cli.bf16 else torch.float32

    dictionary = make_dictionary(cli.vocab - 4)  # + fairseq's 4 special symbols
    g = torch.Generator().manual_seed(0)
    src = torch.randint(dictionary.nspecial, len(dictionary), (cli.batch, cli.src_len), generator=g)
    src[:, -1] = dictionary.eos()
    prev = torch.randint(dictionary.nspecial, len(dictionary), (cli.batch, cli.tgt_len), generator=g)
    prev[:, 0] = dictionary.eos()
    lengths = torch.full((cli.batch,), cli.src_len)
    batch = tuple(t.to(device) for t in (src, lengths, prev))

    stock_arch = {"multilayer_transformer_iwslt": "transformer", "multilayer_transformer_wmt_en_de":
                  "transformer_wmt_en_de"}.get(cli.arch, "transformer")
    stock_flags = []
    if cli.arch == "multilayer_transformer_iwslt":
        stock_flags = ["--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                       "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
                       "--decoder-attention-heads", "4", "--encoder-layers", "4", "--decoder-layers", "4"]
    torch.set_num_threads(torch.get_num_threads())
    print(f"device {device}, dtype {dtype}, arch {cli.arch}, batch {cli.batch} x {cli.src_len}/{cli.tgt_len}, "
          f"beam {cli.beam} on {cli.decode_batch} sentences, median of {cli.repeats}")
    stock_model = build(stock_arch, stock_flags, dictionary)
    print(f"stock model: {stock_arch} {' '.join(stock_flags)}")
    print("| model | #params (M) | train step (s) | x stock | beam decode (s) | x stock | peak train mem (MiB) | x stock |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")

    def row(name, flags):
        stock = measure(stock_model, batch, dictionary, cli, device, dtype)
        model = build(cli.arch, shlex.split(flags), dictionary)
        train, decode, peak, params = measure(model, batch, dictionary, cli, device, dtype)
        memory = f"{peak:.0f} | {peak / stock[2]:.2f}" if device.type == "cuda" else "n/a (CPU) | n/a"
        print(f"| {name} | {params / 1e6:.2f} | {train:.3f} | {train / stock[0]:.2f} | {decode:.3f} | "
              f"{decode / stock[1]:.2f} | {memory} |", flush=True)

    row("multilayer_transformer, no option", "")
    for entry in cli.configs:
        name, _, flags = entry.partition(":")
        row(name, flags)


if __name__ == "__main__":
    main()
