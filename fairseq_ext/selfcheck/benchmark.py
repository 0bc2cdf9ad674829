"""Speed, FLOPs and memory of fairseq_ext configurations as ratios to the stock fairseq
Transformer of the same size, measured interleaved so that load from other processes lands
on both sides.

    fairseq-ext benchmark                                   # small config, the default set
    fairseq-ext benchmark --config base --device cuda --dtype fp16
    fairseq-ext benchmark --configs "M-00:--joint-attention m-00" "MS-1:--aux-decoder-layers 1" --json out.json

For each configuration, against the stock model built from the same dictionary and seed:

* training step (forward + backward of a teacher-forced batch): stock and variant are timed
  alternately, step by step (A B A B ...); each pair gives a ratio; the median ratio is
  reported with its interquartile range (IQR). Pairs are added until the IQR is under
  ``--spread`` or the time budget per configuration (``--seconds``) ends.
* decoding on fixed work: the encoder once, then ``--steps`` incremental decoder steps for
  ``--batch`` sentences x beam hypotheses (beam 1 and ``--beam``), with the cache reordered
  every step as beam search does, so that models of different quality do the same work.
* generation: fairseq's SequenceGenerator at ``--beam`` with every hypothesis forced to
  ``--steps`` tokens: the whole decoding of a batch as fairseq-generate runs it (encoder,
  search, bookkeeping), the measure the thesis' decoding speeds compare with.
* FLOPs (torch.utils.flop_counter) of one training step and of one decoding run: the ratio
  of arithmetic, to compare the time ratio with.
* memory: on CUDA the allocator's peak of a training step; everywhere, the bytes of the
  tensors saved for backward in a training step (activations) and of the incremental cache
  after the last decoding step (deterministic, so the extra memory of a technique shows
  without noise); parameters.

``--json FILE`` writes every number (the table runner and docs/performance.md read it), after
every row, so that a run stopped early keeps the rows it finished.
"""
import argparse
import json
import logging
import shlex
import statistics
import time
from contextlib import contextmanager

import torch

from fairseq_ext import keys
from fairseq_ext.model_builder import build_model, make_dictionary

DEFAULT_CONFIGS = [
    "no option:",
    "S-Agg:--joint-attention s-agg",
    "Iter-C-Agg:--joint-attention iter-c-agg",
    "transparent:--joint-attention transparent",
    "M-00:--joint-attention m-00",
    "M-10:--joint-attention m-10",
    "M-11:--joint-attention m-11",
    "serial:--joint-attention serial",
    "flat:--joint-attention flat",
    "hierarchical:--joint-attention hierarchical",
    "MS-1:--aux-decoder-layers 1",
    "MS-1+AIF:--aux-decoder-layers 1 --aux-fusion",
    "MS-12+AIF:--aux-decoder-layers 1,2 --aux-fusion",
    "MS-123+AIF:--aux-decoder-layers 1,2,3 --aux-fusion",
    "Enc-DC:--encoder-self-attention dc",
    "Dec-DC:--decoder-self-attention dc",
    "MMA:--encoder-self-attention mma",
]

SIZES = {  # the stock architecture and the plugin's preset of the same size
    "small": ("transformer_iwslt_de_en", "multilayer_transformer_iwslt",
              ["--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
               "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
               "--encoder-layers", "4", "--decoder-layers", "4"]),
    "base": ("transformer_wmt_en_de", "multilayer_transformer_wmt_en_de", []),
    # a smoke-test size: the code path in seconds (fairseq-ext selfcheck --quick), not a measurement
    "tiny": ("transformer_iwslt_de_en", "multilayer_transformer_iwslt",
             ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
              "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
              "--encoder-layers", "2", "--decoder-layers", "2"]),
    # the model of the CPU benchmark table (docs/reproduction.md): the flags of its training setup, read in main
    "quickstart": ("transformer_iwslt_de_en", "multilayer_transformer_iwslt", None),
}
QUICKSTART_SETUP = "cpu-quickstart"  # configs/tables/setups.yaml, trainings


def size_flags(config: str) -> list:
    """The model-size flags of ``--config``; quickstart's come from the table runner's setup,
    so the benchmark times the very model the CPU benchmark table trains."""
    flags = SIZES[config][2]
    if flags is None:
        from fairseq_ext.reproduce.tables import load_setups

        flags = shlex.split(load_setups()["trainings"][QUICKSTART_SETUP]["flags"])
    return flags


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def quartiles(values):
    if len(values) < 4:
        return min(values), max(values)
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def interleaved_ratio(fn_stock, fn_variant, device, min_pairs, max_pairs, seconds, spread):
    """Median of per-pair time ratios (variant / stock), its IQR, the pairs and the medians."""
    for fn in (fn_stock, fn_variant):  # warm up both (allocator, caches, lazy init)
        fn()
    ratios, t_stock, t_var = [], [], []
    start = time.perf_counter()
    while len(ratios) < max_pairs:
        a = timed(fn_stock, device)
        b = timed(fn_variant, device)
        t_stock.append(a)
        t_var.append(b)
        ratios.append(b / a)
        if len(ratios) >= min_pairs:
            q1, q3 = quartiles(ratios)
            if q3 - q1 <= spread or time.perf_counter() - start > seconds:
                break
    q1, q3 = quartiles(ratios)
    return {"ratio": statistics.median(ratios), "iqr": [q1, q3], "pairs": len(ratios),
            "stock_s": statistics.median(t_stock), "variant_s": statistics.median(t_var)}


def train_step_fn(model, batch):
    src, lengths, prev = batch

    def step():
        model.train()
        model.zero_grad(set_to_none=True)
        logits, extra = model(src, lengths, prev)
        loss = logits.float().logsumexp(-1).mean()
        for aux in (extra.get(keys.AUX_OUT) or []) if isinstance(extra, dict) else []:
            loss = loss + aux.float().logsumexp(-1).mean()
        loss.backward()

    return step


def decode_fn(model, batch, beam, steps, state_out=None):
    """The encoder once, then ``steps`` incremental decoder steps for B x beam hypotheses
    with fixed tokens and a fixed reordering each step (what beam search does per step)."""
    src, lengths, _ = batch
    bsz = src.size(0)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, 100, (bsz * beam, steps + 1), generator=g).to(src.device)
    order = torch.arange(bsz).repeat_interleave(beam).to(src.device)
    # each step keeps the hypotheses of one sentence but shuffles them (a reorder with a copy)
    perms = [(torch.arange(bsz * beam).view(bsz, beam)[:, torch.randperm(beam, generator=g)]).reshape(-1).to(src.device)
             for _ in range(steps)]

    def run():
        model.eval()
        with torch.no_grad():
            enc = model.encoder(src, src_lengths=lengths)
            enc = model.encoder.reorder_encoder_out(enc, order)
            state = {}
            for t in range(steps):
                model.decoder(tokens[:, : t + 1], encoder_out=enc, incremental_state=state)
                model.decoder.reorder_incremental_state_scripting(state, perms[t])
            if state_out is not None:
                state_out.clear()
                state_out.update(state)

    return run


def generate_fn(model, batch, dictionary, beam, steps):
    """fairseq's own beam search (SequenceGenerator, as fairseq-generate decodes) with every
    hypothesis forced to ``steps`` tokens: the whole decoding of a batch, with the search's
    bookkeeping, on the same work for every model (what the thesis' decoding speeds time)."""
    from fairseq.sequence_generator import SequenceGenerator

    src, lengths, _ = batch
    generator = SequenceGenerator([model], dictionary, beam_size=beam, min_len=steps, max_len_a=0, max_len_b=steps)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}

    def run():
        model.eval()
        with torch.no_grad():
            hypos = generator.generate([model], sample)
        assert all(len(h[0]["tokens"]) == steps + 1 for h in hypos), "forced length not kept"

    return run


def flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@contextmanager
def saved_for_backward():
    """Bytes of the tensors autograd saves for backward (the activations of a step)."""
    seen = {"bytes": 0, "ptrs": set()}

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if key not in seen["ptrs"]:
            seen["ptrs"].add(key)
            seen["bytes"] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


def cache_bytes(state) -> int:
    total, seen = 0, set()
    for buffer in state.values():
        for value in (buffer.values() if isinstance(buffer, dict) else []):
            if torch.is_tensor(value) and value.data_ptr() not in seen:
                seen.add(value.data_ptr())
                total += value.numel() * value.element_size()
    return total


def profile(model, batch, cli, device):
    """Deterministic numbers: FLOPs of a train step and of a decoding run, activation bytes,
    cache bytes, CUDA peak of a train step, parameters."""
    step = train_step_fn(model, batch)
    out = {"params": sum(p.numel() for p in model.parameters()), "train_flops": flops(step)}
    with saved_for_backward() as saved:
        step()
    out["activation_bytes"] = saved["bytes"]
    state = {}
    dec = decode_fn(model, batch, cli.beam, cli.steps, state_out=state)
    out["decode_flops"] = flops(dec)
    dec()
    out["cache_bytes"] = cache_bytes(state)
    if device.type == "cuda":
        out["cuda_peak_bytes"] = step_peak_bytes(model, step, device)
    return out


def step_peak_bytes(model, step, device) -> int:
    """The CUDA allocator's peak during one training step of ``model``, counting the memory
    that is this model's (its parameters, gradients, activations and the step's temporaries),
    not what other tensors hold: the stock model and its gradients stay on the device while a
    variant is measured, and an absolute peak would count them in the variant's."""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    resident = torch.cuda.memory_allocated(device)
    own = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - resident + own


def print_profiles(stock, variants, batch, cli, device) -> int:
    """Where the time of one training step or one decoding run goes (what docs/performance.md's
    explanations of time ratios above the FLOP ratio come from)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name, model in [("stock", stock)] + variants:
        fn = train_step_fn(model, batch) if cli.profile == "train" else decode_fn(model, batch, cli.beam, cli.steps)
        fn()  # warm-up
        with torch_profile(activities=activities) as prof:
            fn()
            sync(device)
        print(f"## {name}: one {'training step' if cli.profile == 'train' else f'decoding run (beam {cli.beam})'}")
        print(prof.key_averages().table(sort_by=sort, row_limit=10))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="fairseq-ext benchmark", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(SIZES), default="small", help="model size (default small)")
    parser.add_argument("--configs", nargs="*", default=DEFAULT_CONFIGS, help="NAME:FLAGS entries")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=16, help="sentences per training batch and per decoding run")
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--tgt-len", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30, help="incremental decoding steps per run")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--min-pairs", type=int, default=7)
    parser.add_argument("--max-pairs", type=int, default=41)
    parser.add_argument("--seconds", type=float, default=30.0, help="time budget per configuration and measure")
    parser.add_argument("--spread", type=float, default=0.04, help="stop adding pairs when the IQR is below this")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write every number here")
    parser.add_argument("--profile", choices=["train", "decode"],
                        help="instead of ratios: torch.profiler's table of the stock model and of each --configs "
                             "entry (one training step, or one decoding run at --beam), by self CPU/CUDA time")
    cli = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    if cli.threads:
        torch.set_num_threads(cli.threads)
    device = torch.device(cli.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU")
    if cli.dtype == "fp16" and device.type != "cuda":
        # measured: DC's training step at 11.9x stock, 89% of it in torch's CPU fp16 convolution backward
        parser.error("--dtype fp16 needs --device cuda: torch's fp16 kernels on CPU (e.g. convolution backward) "
                     "are reference code, so the ratio would time them and not the technique; use --dtype bf16 "
                     "on a CPU")
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[cli.dtype]

    dictionary = make_dictionary(cli.vocab - 4)
    g = torch.Generator().manual_seed(cli.seed)
    src = torch.randint(dictionary.nspecial, len(dictionary), (cli.batch, cli.src_len), generator=g)
    src[:, -1] = dictionary.eos()
    prev = torch.randint(dictionary.nspecial, len(dictionary), (cli.batch, cli.tgt_len), generator=g)
    prev[:, 0] = dictionary.eos()
    lengths = torch.full((cli.batch,), cli.src_len)
    batch = tuple(t.to(device) for t in (src, lengths, prev))
    stock_arch, arch, _ = SIZES[cli.config]
    sizes = size_flags(cli.config)

    def build(a, flags):
        model, _ = build_model(a, "--share-all-embeddings", "--dropout", "0.1", *sizes, *flags,
                               dictionary=dictionary, seed=cli.seed)
        return model.to(device=device, dtype=dtype)

    stock = build(stock_arch, [])
    if cli.profile:
        return print_profiles(stock, [(entry.partition(":")[0], build(arch, shlex.split(entry.partition(":")[2])))
                                      for entry in cli.configs], batch, cli, device)
    stock_profile = profile(stock, batch, cli, device)
    print(f"device {device} ({torch.get_num_threads()} threads), {cli.dtype}, {cli.config} config ({arch} vs "
          f"stock {stock_arch}), batch {cli.batch} x {cli.src_len}/{cli.tgt_len}, decoding {cli.steps} steps "
          f"(beam 1 and {cli.beam}); time ratios: median of interleaved pairs [IQR]")
    print("| model | #params (M) | train time | train FLOPs | decode beam 1 | decode beam "
          f"{cli.beam} | decode FLOPs | generate beam {cli.beam} | activations | cache |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    results = {"settings": vars(cli), "stock": {"arch": stock_arch, **stock_profile}, "configs": []}
    for entry in cli.configs:
        name, _, flags = entry.partition(":")
        model = build(arch, shlex.split(flags))
        prof = profile(model, batch, cli, device)
        train = interleaved_ratio(train_step_fn(stock, batch), train_step_fn(model, batch), device,
                                  cli.min_pairs, cli.max_pairs, cli.seconds, cli.spread)
        dec1 = interleaved_ratio(decode_fn(stock, batch, 1, cli.steps), decode_fn(model, batch, 1, cli.steps),
                                 device, cli.min_pairs, cli.max_pairs, cli.seconds, cli.spread)
        decb = interleaved_ratio(decode_fn(stock, batch, cli.beam, cli.steps),
                                 decode_fn(model, batch, cli.beam, cli.steps), device, cli.min_pairs, cli.max_pairs,
                                 cli.seconds, cli.spread)
        gen = interleaved_ratio(generate_fn(stock, batch, dictionary, cli.beam, cli.steps),
                                generate_fn(model, batch, dictionary, cli.beam, cli.steps), device, cli.min_pairs,
                                cli.max_pairs, cli.seconds, cli.spread)
        rec = {"name": name, "flags": flags, **prof, "train": train, "decode_beam1": dec1, "decode_beam": decb,
               "generate_beam": gen,
               "train_flops_ratio": prof["train_flops"] / stock_profile["train_flops"],
               "decode_flops_ratio": prof["decode_flops"] / stock_profile["decode_flops"],
               "activation_ratio": prof["activation_bytes"] / stock_profile["activation_bytes"],
               "cache_ratio": prof["cache_bytes"] / max(1, stock_profile["cache_bytes"])}
        if device.type == "cuda":
            rec["cuda_peak_ratio"] = prof["cuda_peak_bytes"] / stock_profile["cuda_peak_bytes"]
        results["configs"].append(rec)

        def fmt(r):
            return f"{r['ratio']:.2f} [{r['iqr'][0]:.2f}-{r['iqr'][1]:.2f}]"

        print(f"| {name} | {prof['params'] / 1e6:.2f} | {fmt(train)} | {rec['train_flops_ratio']:.2f} | {fmt(dec1)} | "
              f"{fmt(decb)} | {rec['decode_flops_ratio']:.2f} | {fmt(gen)} | {rec['activation_ratio']:.2f} | "
              f"{rec['cache_ratio']:.2f} |", flush=True)
        del model
        if cli.json:  # after every row: a run stopped early keeps the rows it finished
            with open(cli.json, "w", encoding="utf-8") as f:
                json.dump(results, f, indent=1)
    return 0
