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
  ``--batch`` sentences x beam hypotheses (beam 1 and ``--beam``), with the cache reordered every
  step as beam search does (greedy, at beam 1: never), so that models of different quality do the same work.
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
import logging
import shlex

import torch

from fairseq_ext import keys
from fairseq_ext.errors import OptionError
from fairseq_ext.model_builder import FlagError, build_model, make_dictionary, parse_model_args
from fairseq_ext.selfcheck import updates
from fairseq_ext.selfcheck.timing import (DEFAULT_CONFIGS, ROWS, SIZES, dispatch_counts, flops, generate_fn,
                                           interleaved_ratio, size_flags, sync, write_json)


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
    """The encoder once, then ``steps`` incremental decoder steps for B x beam hypotheses with fixed tokens,
    each step's reorder shuffling the hypotheses of every sentence (a copy); at beam 1 (greedy) none."""
    src, lengths, _ = batch
    bsz = src.size(0)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, 100, (bsz * beam, steps + 1), generator=g).to(src.device)
    order = torch.arange(bsz).repeat_interleave(beam).to(src.device)
    perms = [(torch.arange(bsz * beam).view(bsz, beam)[:, torch.randperm(beam, generator=g)]).reshape(-1).to(src.device)
             for _ in range(steps)]

    def run():
        model.eval()
        with torch.no_grad():
            enc = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths), order)
            state = {}
            for t in range(steps):
                model.decoder(tokens[:, : t + 1], encoder_out=enc, incremental_state=state)
                if beam > 1:
                    model.decoder.reorder_incremental_state_scripting(state, perms[t])
            if state_out is not None:
                state_out.clear()
                state_out.update(state)

    return run


def profile(model, batch, cli, device):
    """FLOPs of a train step and a decoding run, activation and cache bytes, parameters; on CUDA the
    allocator's peak in a training step counting only this model's memory (the stock model stays
    on the device while a variant is measured)."""
    step, state, saved = train_step_fn(model, batch), {}, {}
    out = {"params": sum(p.numel() for p in model.parameters()), "train_flops": flops(step)}
    # operators (kernels on a GPU) and host syncs of a training step and of one decoding step
    out["train_ops"], out["train_syncs"] = dispatch_counts(step)
    decode_fn(model, batch, cli.beam, 1)()  # what decoding makes once (weights concatenated) is not a step's
    one, two = (dispatch_counts(decode_fn(model, batch, cli.beam, n)) for n in (1, 2))
    out["step_ops"], out["step_syncs"] = two[0] - one[0], two[1] - one[1]

    def pack(t):  # the bytes of each storage autograd saves for backward (the step's activations)
        saved[(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    out["activation_bytes"] = sum(saved.values())
    dec = decode_fn(model, batch, cli.beam, cli.steps, state_out=state)
    out["decode_flops"] = flops(dec)
    dec()
    cached = {}  # bytes by storage: a tensor cached under two keys counts once
    for buffer in state.values():
        for value in (buffer.values() if isinstance(buffer, dict) else []):
            if torch.is_tensor(value):
                cached.setdefault(value.data_ptr(), value.numel() * value.element_size())
    out["cache_bytes"] = sum(cached.values())
    if device.type == "cuda":
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        resident = torch.cuda.memory_allocated(device)
        own = sum(p.numel() * p.element_size() for p in model.parameters())
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        out["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device) - resident + own
    return out


def print_profiles(models, measure, cli, device) -> int:
    """Where the time of one training step or one decoding run goes (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for name, model in models:
        fn = measure(model)
        fn()  # warm-up
        with torch_profile(activities=activities) as prof:
            fn()
            sync(device)
        print(f"## {name}: one {'training step' if cli.profile == 'train' else f'decoding run (beam {cli.beam})'}")
        print(prof.key_averages().table(sort_by=f"self_{device.type}_time_total", row_limit=10))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="fairseq-ext benchmark", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1] + "\n" + updates.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["steps", "updates"], default="steps",
                        help="steps (default): forward + backward of a synthetic --batch x --src-len/--tgt-len "
                             "batch, decoding and memory; updates: fairseq's training updates (optimizer step, "
                             "loss scaler) at --max-tokens batches of real lengths, and beam search on them")
    parser.add_argument("--config", choices=sorted(SIZES), default="small", help="model size (default small)")
    parser.add_argument("--configs", nargs="*", default=None,
                        help="NAME:FLAGS entries, or the NAME of a known row (e.g. M-10, Full-DC); default: "
                             "a row per technique (steps), the thesis' training-overhead rows (updates)")
    parser.add_argument("--vocab", type=int, default=None,
                        help="dictionary size (default 8000 with --mode steps, 32000 with --mode updates)")
    parser.add_argument("--batch", type=int, default=16,
                        help="sentences per training batch and per decoding run (--mode steps)")
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--tgt-len", type=int, default=30)
    parser.add_argument("--steps", type=int, default=30, help="incremental decoding steps per run (--mode steps)")
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
                             "entry (one training step, or one decoding run at --beam), by self CPU/CUDA time; "
                             "with --mode updates, train only: each model alone at every --max-tokens, its --updates "
                             "timed (tokens/s, TFLOP/s, peak memory), then profiled (host and device ms, kernels and "
                             "host syncs per update)")
    updates.add_arguments(parser)
    cli = parser.parse_args(argv)
    if cli.vocab is not None and cli.vocab < 5:
        raise OptionError(f"--vocab {cli.vocab}: must be at least 5 (the 4 special symbols and a word)")
    if cli.mode == "steps":
        given = [o for o, v in (("--max-tokens", cli.max_tokens), ("--data", cli.data), ("--settle", cli.settle))
                 if v is not None]
        if given:
            parser.error(f"{', '.join(given)}: with --mode updates only")
        cli.vocab = cli.vocab or 8000
        cli.configs = DEFAULT_CONFIGS if cli.configs is None else cli.configs
    else:
        updates.check_arguments(cli, parser)
    for entry in cli.configs:  # a bare NAME takes the flags of the known row
        if ":" not in entry and entry not in ROWS:
            parser.error(f"--configs {entry}: not a known row ({', '.join(ROWS)}); give NAME:FLAGS")
    cli.configs = [entry if ":" in entry else f"{entry}:{ROWS[entry]}" for entry in cli.configs]
    logging.disable(logging.WARNING)
    for entry in cli.configs:  # every row's flags known to fairseq-train, before anything runs
        try:
            parse_model_args(SIZES[cli.config][1], *size_flags(cli.config), *shlex.split(entry.partition(":")[2]))
        except FlagError as error:
            raise OptionError(f"--configs {entry}: {error}") from None
        except OptionError as error:  # a row the size cannot build (MS-4 below 5 layers): --mode updates says it in its row
            if cli.mode == "steps":
                raise OptionError(f"--configs {entry}: {error} (at --config {cli.config})") from None
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
    return updates.run(cli, parser, device) if cli.mode == "updates" else run_steps(cli, device, dtype)


def run_steps(cli, device, dtype) -> int:
    dictionary = make_dictionary(cli.vocab - 4)
    g = torch.Generator().manual_seed(cli.seed)
    src = torch.randint(dictionary.nspecial, len(dictionary), (cli.batch, cli.src_len), generator=g)
    src[:, -1] = dictionary.eos()
    prev = torch.randint(dictionary.nspecial, len(dictionary), (cli.batch, cli.tgt_len), generator=g)
    prev[:, 0] = dictionary.eos()
    batch = tuple(t.to(device) for t in (src, torch.full((cli.batch,), cli.src_len), prev))
    stock_arch, arch, _ = SIZES[cli.config]

    def build(a, flags):
        model, _ = build_model(a, "--share-all-embeddings", "--dropout", "0.1", *size_flags(cli.config), *flags,
                               dictionary=dictionary, seed=cli.seed)
        return model.to(device=device, dtype=dtype)

    measures = {"train": lambda m: train_step_fn(m, batch), "decode_beam1": lambda m: decode_fn(m, batch, 1, cli.steps),
                "decode_beam": lambda m: decode_fn(m, batch, cli.beam, cli.steps),
                "generate_beam": lambda m: generate_fn(m, batch, dictionary, cli.beam, cli.steps)}
    stock = build(stock_arch, [])
    if cli.profile:
        rows = [(entry.partition(":")[0], build(arch, shlex.split(entry.partition(":")[2]))) for entry in cli.configs]
        return print_profiles([("stock", stock)] + rows, measures["train" if cli.profile == "train" else "decode_beam"],
                              cli, device)
    stock_profile = profile(stock, batch, cli, device)
    print(f"device {device} ({torch.get_num_threads()} threads), {cli.dtype}, {cli.config} config ({arch} vs "
          f"stock {stock_arch}), batch {cli.batch} x {cli.src_len}/{cli.tgt_len}, decoding {cli.steps} steps "
          f"(beam 1 and {cli.beam}); time ratios: median of interleaved pairs [IQR]")
    print("| model | #params (M) | train time | train FLOPs | train ops | decode beam 1 | decode beam "
          f"{cli.beam} | decode FLOPs | step ops | generate beam {cli.beam} | activations | cache | host syncs "
          f"(train, step; stock {stock_profile['train_syncs']}, {stock_profile['step_syncs']}) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    results = {"settings": vars(cli), "stock": {"arch": stock_arch, **stock_profile}, "configs": []}
    for entry in cli.configs:
        name, _, flags = entry.partition(":")
        model = build(arch, shlex.split(flags))
        prof = profile(model, batch, cli, device)
        rec = {"name": name, "flags": flags, **prof,
               **{key: interleaved_ratio(fn(stock), fn(model), device, cli) for key, fn in measures.items()},
               "train_flops_ratio": prof["train_flops"] / stock_profile["train_flops"],
               "decode_flops_ratio": prof["decode_flops"] / stock_profile["decode_flops"],
               "activation_ratio": prof["activation_bytes"] / stock_profile["activation_bytes"],
               "cache_ratio": prof["cache_bytes"] / max(1, stock_profile["cache_bytes"]),
               "train_ops_ratio": prof["train_ops"] / stock_profile["train_ops"],
               "step_ops_ratio": prof["step_ops"] / stock_profile["step_ops"]}
        if device.type == "cuda":
            rec["cuda_peak_ratio"] = prof["cuda_peak_bytes"] / stock_profile["cuda_peak_bytes"]
        results["configs"].append(rec)
        train, dec1, decb, gen = (f"{rec[k]['ratio']:.2f} [{rec[k]['iqr'][0]:.2f}-{rec[k]['iqr'][1]:.2f}]"
                                  for k in measures)
        print(f"| {name} | {prof['params'] / 1e6:.2f} | {train} | {rec['train_flops_ratio']:.2f} | "
              f"{rec['train_ops_ratio']:.2f} | {dec1} | {decb} | {rec['decode_flops_ratio']:.2f} | "
              f"{rec['step_ops_ratio']:.2f} | {gen} | {rec['activation_ratio']:.2f} | {rec['cache_ratio']:.2f} | "
              f"{prof['train_syncs']}, {prof['step_syncs']} |", flush=True)
        del model
        write_json(cli.json, results)
    return 0
