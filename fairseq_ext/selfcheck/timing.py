"""What both modes of ``fairseq-ext benchmark`` share: the model sizes and rows, and timing
stock against a row interleaved (the median of per-pair time ratios with its IQR), fairseq's
beam search forced to a fixed length, and torch's FLOP counter."""
import shlex
import statistics
import time

import torch

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


def known_rows() -> dict:
    """NAME -> FLAGS of every row this module or the bench stage knows (a bare ``--configs NAME``)."""
    from fairseq_ext.selfcheck.stages import BASE_ROWS, SMALL_ROWS

    rows = {}
    for entry in DEFAULT_CONFIGS + BASE_ROWS + SMALL_ROWS:
        name, _, flags = entry.partition(":")
        rows.setdefault(name, flags)
    return rows


def resolve_configs(entries) -> list:
    """``NAME:FLAGS`` entries as given; a bare ``NAME`` (no colon) takes the flags of the known row."""
    rows, out = known_rows(), []
    for entry in entries:
        if ":" not in entry:
            if entry not in rows:
                raise ValueError(f"--configs {entry}: not a known row ({', '.join(rows)}); give NAME:FLAGS")
            entry = f"{entry}:{rows[entry]}"
        out.append(entry)
    return out
