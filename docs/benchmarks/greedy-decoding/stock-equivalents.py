"""Greedy decoding of flat and MS-1+AIF against stock fairseq doing the same work.

The benchmark's greedy workload (scripts/benchmark.py --batch 64 --beam 1 --steps 30 --threads 1): 64
sentences of 30 source tokens, the encoder once and 30 incremental steps, no reorder, small config,
vocabulary 8,000, dropout 0, fp32. Each row is timed three ways, interleaved, as time ratios to the
stock model (median of the pairs [quartiles]), with torch's FLOP counter on the same work:
- the plugin's row;
- stock fairseq's own modules doing that row's work, nothing of the plugin in the step:
  - flat: the stock decoder attending the four encoder layers' outputs side by side (120 positions,
    one softmax, one key and one value projection: flat's Eq. 5-6);
  - MS-1+AIF: the stock model plus a second stock decoder's layers reading encoder layer 1, stepped
    with it (MS-1's auxiliary decoder; AIF's projections are the plugin's only FLOPs left out);
- flat only: the plugin's flat with each step's attention replaced by one read of its cached keys and
  values (a sum of each), no arithmetic: what any attention that reads them once a step pays at least.

    python docs/benchmarks/greedy-decoding/stock-equivalents.py --pairs 15 --json out.json
"""
import argparse
import copy
import json
import statistics
import time

import torch

import fairseq_ext.modules.multi_source_attention as flat_module
from fairseq_ext.model_builder import build_model, make_dictionary
from fairseq_ext.selfcheck.timing import ROWS, SIZES, flops, quartiles


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json")
    cli = parser.parse_args()
    torch.set_num_threads(cli.threads)
    stock_arch, arch, size = SIZES["small"]
    dictionary = make_dictionary(8000 - 4)
    common = [*size, "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]

    def model(a, flags=()):
        return build_model(a, *common, *flags, dictionary=dictionary, seed=1)[0].eval()

    batch, source_len, steps = 64, 30, 30
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(4, 8000, (batch, source_len), generator=generator)
    lengths = torch.full((batch,), source_len)
    tokens = torch.randint(4, 8000, (batch, steps + 1), generator=generator)
    tokens[:, 0] = dictionary.eos()
    stock = model(stock_arch)
    second = copy.deepcopy(stock.decoder)  # its own parameters, as an auxiliary decoder has

    @torch.no_grad()
    def decode(m, memory=lambda enc: enc, with_second=False):
        enc = m.encoder(src, src_lengths=lengths, return_all_hiddens=True)
        mem, state, second_state = memory(enc), {}, {}
        layer_1 = {**enc, "encoder_out": [enc["encoder_states"][1]]}
        for t in range(steps):
            if with_second:  # its features only, as an auxiliary decoder's in an incremental step
                second.extract_features(tokens[:, :t + 1], encoder_out=layer_1, incremental_state=second_state)
            m.decoder(tokens[:, :t + 1], encoder_out=mem, incremental_state=state)

    def side_by_side(enc):  # the four encoder layers' outputs along the length axis
        mask = enc["encoder_padding_mask"][0]
        return {**enc, "encoder_out": [torch.cat(enc["encoder_states"][-4:], 0)],
                "encoder_padding_mask": [mask.repeat(1, 4)]}

    flat_attention = flat_module.flat_attention

    def read_only(q, k, v, num_sources, key_padding_mask, dropout, every_weight=True):
        read = k.sum() + v.sum()
        per_position = q.new_zeros(q.shape[:-1] + (k.size(-2) // num_sources,))
        context = q + 0 * read
        return (context, per_position, per_position) if every_weight else (context, per_position)

    def reading_only(m):
        flat_module.flat_attention = read_only
        try:
            decode(m)
        finally:
            flat_module.flat_attention = flat_attention

    rows = {
        "flat": (model(arch, ROWS["flat"].split()), lambda: decode(stock, side_by_side)),
        "MS-1+AIF": (model(arch, ROWS["MS-1+AIF"].split()), lambda: decode(stock, with_second=True)),
    }

    def summary(ratios):  # the median and its quartiles, as the benchmark takes them
        q1, q3 = quartiles(ratios)
        return {"median": statistics.median(ratios), "q1": q1, "q3": q3, "pairs": ratios}

    stock_flops = flops(lambda: decode(stock))
    results = {"threads": cli.threads, "pairs": cli.pairs, "torch": torch.__version__, "rows": {}}
    print("| row | FLOPs: plugin | FLOPs: stock doing its work | time: plugin | time: stock doing its work "
          "| time: reading the keys and values only |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (plugin, equivalent) in rows.items():
        timed = {"plugin": lambda: decode(plugin), "stock_equivalent": equivalent}
        if name == "flat":
            timed["reading_only"] = lambda: reading_only(plugin)
        for fn in (lambda: decode(stock), *timed.values()):
            fn()  # warm-up
        ratios = {key: [] for key in timed}
        for _ in range(cli.pairs):
            a = time.perf_counter()
            decode(stock)
            stock_s = time.perf_counter() - a
            for key, fn in timed.items():
                a = time.perf_counter()
                fn()
                ratios[key].append((time.perf_counter() - a) / stock_s)
        row = {"flops_plugin": flops(lambda: decode(plugin)) / stock_flops,
               "flops_stock_equivalent": flops(equivalent) / stock_flops,
               **{f"time_{key}": summary(values) for key, values in ratios.items()}}
        results["rows"][name] = row
        cell = lambda s: f"{s['median']:.2f} [{s['q1']:.2f}-{s['q3']:.2f}]" if s else "-"  # noqa: E731
        print(f"| {name} | {row['flops_plugin']:.3f} | {row['flops_stock_equivalent']:.3f} | "
              f"{cell(row['time_plugin'])} | {cell(row['time_stock_equivalent'])} | "
              f"{cell(row.get('time_reading_only'))} |", flush=True)
    if cli.json:
        with open(cli.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
