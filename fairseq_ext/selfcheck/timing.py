"""What both modes of ``fairseq-ext benchmark`` share: the model sizes and rows, interleaved
timing, fairseq's beam search forced to a fixed length, the FLOP counter, the JSON."""
import json
import shlex
import statistics
import time

import torch

ROWS = {  # NAME -> FLAGS: every row the benchmark knows by its name (``--configs NAME``)
    "no option": "",
    **{name: f"--joint-attention {name.lower()}" for name in ("S-Agg", "Iter-C-Agg", "transparent", "M-00", "M-01",
                                                              "M-10", "M-11", "serial", "flat", "hierarchical")},
    "MS-1": "--aux-decoder-layers 1", "MS-4": "--aux-decoder-layers 4",
    "MS-1+AIF": "--aux-decoder-layers 1 --aux-fusion", "MS-12+AIF": "--aux-decoder-layers 1,2 --aux-fusion",
    "MS-123+AIF": "--aux-decoder-layers 1,2,3 --aux-fusion",
    "Enc-DC": "--encoder-self-attention dc", "Dec-DC": "--decoder-self-attention dc",
    "Full-DC": "--encoder-self-attention dc --decoder-self-attention dc", "MMA": "--encoder-self-attention mma",
}
# --mode steps by default: a row per technique
DEFAULT_CONFIGS = ["no option", "S-Agg", "Iter-C-Agg", "transparent", "M-00", "M-10", "M-11", "serial", "flat",
                   "hierarchical", "MS-1", "MS-1+AIF", "MS-12+AIF", "MS-123+AIF", "Enc-DC", "Dec-DC", "MMA"]
# the thesis' training overheads (the bench stage's base config) and its MS+AIF decoding overheads (small)
BASE_ROWS = ["no option", "Iter-C-Agg", "M-00", "M-01", "M-10", "M-11", "MS-4", "MS-1+AIF", "Enc-DC", "Dec-DC",
             "Full-DC", "MMA"]
SMALL_ROWS = ["MS-1+AIF", "MS-12+AIF", "MS-123+AIF"]

SIZES = {  # the stock architecture and the plugin's preset of the same size
    "small": ("transformer_iwslt_de_en", "multilayer_transformer_iwslt",
              ["--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
               "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
               "--encoder-layers", "4", "--decoder-layers", "4"]),
    "base": ("transformer_wmt_en_de", "multilayer_transformer_wmt_en_de", []),
    # a smoke-test size: the code path in seconds (fairseq-ext selfcheck --quick), not a measurement
    "tiny": ("transformer_iwslt_de_en", "multilayer_transformer_iwslt",
             ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]),
    # the model of the CPU benchmark table (docs/reproduction.md): the flags of its training setup, read in main
    "quickstart": ("transformer_iwslt_de_en", "multilayer_transformer_iwslt", None),
}
QUICKSTART_SETUP = "cpu-quickstart"  # configs/tables/setups.yaml, trainings


def size_flags(config: str) -> list:
    """The model-size flags of ``--config`` (quickstart's: the model the CPU benchmark table trains)."""
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


def interleaved_ratio(fn_stock, fn_variant, device, cli):
    """Median of per-pair time ratios (variant / stock) with its IQR: pairs up to ``--max-pairs``
    until the IQR is within ``--spread`` or ``--seconds`` have gone by."""
    for fn in (fn_stock, fn_variant):  # warm up both (allocator, caches, lazy init)
        fn()
    ratios, t_stock, t_var = [], [], []
    start = time.perf_counter()
    while len(ratios) < cli.max_pairs:
        t_stock.append(timed(fn_stock, device))
        t_var.append(timed(fn_variant, device))
        ratios.append(t_var[-1] / t_stock[-1])
        if len(ratios) >= cli.min_pairs:
            q1, q3 = quartiles(ratios)
            if q3 - q1 <= cli.spread or time.perf_counter() - start > cli.seconds:
                break
    q1, q3 = quartiles(ratios)
    return {"ratio": statistics.median(ratios), "iqr": [q1, q3], "pairs": len(ratios),
            "stock_s": statistics.median(t_stock), "variant_s": statistics.median(t_var)}


def generate_fn(model, batch, dictionary, beam, steps):
    """fairseq's SequenceGenerator with every hypothesis forced to ``steps`` tokens: the same work
    for every model."""
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


# what makes a GPU's host wait: .item(), bool(), int() (all _local_scalar_dense), outputs sized by the data
SYNC_OPS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique2",
            "aten.unique_consecutive", "aten.repeat_interleave"}


def dispatch_counts(fn) -> tuple:
    """(operators dispatched, host syncs) of ``fn()``: every aten operator, forward and backward, that computes (a
    kernel on a GPU; views, which only describe memory, are not counted), and of all operators :data:`SYNC_OPS`, plus
    each ``.tolist()`` and ``.cpu()`` (no operator on a CPU tensor; a copy the host waits for on a GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = [0, 0]

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts[0] += not (func.is_view or func.overloadpacket is torch.ops.aten._unsafe_view)
            counts[1] += str(func.overloadpacket) in SYNC_OPS
            return func(*args, **(kwargs or {}))

    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "cpu")}

    def counted(original):
        def call(self, *args, **kwargs):
            counts[1] += 1
            return original(self, *args, **kwargs)
        return call

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counted(original))
        with Counting():
            fn()
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return counts[0], counts[1]


def speed(r: dict) -> str:
    """A time ratio as a speed with its IQR: '0.74 [0.72-0.76]'."""
    return f"{1 / r['ratio']:.2f} [{1 / r['iqr'][1]:.2f}-{1 / r['iqr'][0]:.2f}]"


def write_json(path, results) -> None:
    if path:  # after every row: a run stopped early keeps the rows it finished
        with open(path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
