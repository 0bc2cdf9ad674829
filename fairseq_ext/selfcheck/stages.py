"""The ``env``, ``tests`` and ``bench`` stages of the self-check (docs/selfcheck.md). ``env``'s
one matmul per precision makes a broken install fail in seconds, not ten minutes into training;
``bench``'s speeds are 1 / the time ratio, as the thesis gives its overheads."""
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Tuple

import torch

from fairseq_ext.errors import CommandError
from fairseq_ext.selfcheck.stage_files import last_line, read_json, run_logged, table, write_stage
from fairseq_ext.selfcheck.timing import BASE_ROWS, ROWS, SMALL_ROWS, speed

PACKAGES = ("fairseq", "fairseq-fixed", "fairseq_ext", "torch", "numpy", "hydra-core", "omegaconf", "sacrebleu",
            "sentencepiece", "subword-nmt", "sacremoses", "compare-mt", "bitarray", "matplotlib", "pytest",
            "tensorboardX", "nltk", "PyYAML")
TEST_FILES = ("models/test_on_device.py",)
QUICK_OPTION_SETS = ("combined",)  # --quick: this option set only (M-10, DC, MMA, MS, AIF, pre-classifier)
TEST_FUNCTIONS = {  # test function -> the column group of the summary and its precisions
    "test_fairseq_trainer_steps_lower_the_loss": ("trains", ("fp32", "fp16", "memory-efficient-fp16", "bf16", "amp")),
    "test_incremental_decoding_equals_the_full_forward": ("incremental = full", ("fp32", "fp16", "bf16")),
    "test_beam_search_gives_the_same_hypotheses_batched_and_alone": ("beam: batched = alone", ("fp32", "fp16", "bf16")),
}
MARKS = {"passed": "ok", "failed": "FAIL", "error": "ERROR", "skipped": "skip"}
# the thesis' overheads as speeds relative to its baseline (Ch. 3-5; GPU times)
THESIS_TRAIN = {"Iter-C-Agg": 0.85, "M-00": 0.73, "M-01": 0.75, "M-10": 0.71, "M-11": 0.74, "MS-4": 0.60,
                "MS-1+AIF": 0.59, "Enc-DC": 0.82, "Dec-DC": 0.84, "Full-DC": 0.69}
THESIS_DECODE = {"MS-1+AIF": 0.62, "MS-12+AIF": 0.47, "MS-123+AIF": 0.35}
QUICK_BENCH = ["--batch", "2", "--src-len", "7", "--tgt-len", "7", "--steps", "3", "--min-pairs", "3",
               "--max-pairs", "3", "--seconds", "1", "--vocab", "500", "--threads", "1"]


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            if name == "torch":  # said to be missing; the others left out
                versions[name] = None
    try:
        import fairseq

        versions["fairseq (import)"] = fairseq.__version__
    except ImportError as e:  # the check says so instead of failing
        versions["fairseq (import)"] = f"not importable: {e}"
    return versions


def nvidia_smi() -> dict:
    query = "name,driver_version,memory.total,compute_cap"
    try:
        lines = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):  # no nvidia-smi
        lines = []
    rows = [dict(zip(query.split(","), (c.strip() for c in line.split(",")))) for line in lines if line.strip()]
    return {"gpus": rows} if rows else {}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def precision_smoke(device: torch.device) -> dict:
    """One 256 x 256 matmul per precision on the device, against fp64: the relative error."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(256, 256, generator=g, dtype=torch.float64) for _ in range(2))
    exact, out = a @ b, {}
    for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        try:
            got = (a.to(device, dtype) @ b.to(device, dtype)).double().cpu()
            out[name] = float((got - exact).abs().max() / exact.abs().max())
        except RuntimeError as e:  # e.g. fp16 matmul on an old CPU build
            out[name] = f"failed: {str(e).splitlines()[0]}"
    return out


def run_env(out: str, device: torch.device, **_) -> List[str]:
    facts = {"device": str(device), "torch": torch.__version__, "cuda_build": torch.version.cuda,
             "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
             "cuda_available": torch.cuda.is_available(), "cpu_threads": torch.get_num_threads(),
             "cpu_count": os.cpu_count(), "cpu": cpu_name(), "python": sys.version.split()[0],
             "platform": platform.platform()}
    rows = []
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(gpu_name=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                     compute_capability=f"{props.major}.{props.minor}", gpu_count=torch.cuda.device_count(),
                     bf16_supported=torch.cuda.is_bf16_supported())
        rows += [["GPU memory", f"{facts['gpu_memory_gib']} GiB"], ["compute capability", facts["compute_capability"]],
                 ["GPUs", facts["gpu_count"]], ["bf16", "yes" if facts["bf16_supported"] else "no"]]
    versions, smi, smoke = package_versions(), nvidia_smi(), precision_smoke(device)
    rows = [["device", facts.get("gpu_name", facts["cpu"]) + f" ({device})"]] + rows
    rows += [["NVIDIA driver", gpu.get("driver_version")] for gpu in smi.get("gpus", [])[:1]]
    rows += [["torch", facts["torch"]], ["CUDA (torch build)", facts["cuda_build"]], ["cuDNN", facts["cudnn"]],
             ["Python", facts["python"]], ["CPU cores", facts["cpu_count"]], ["platform", facts["platform"]]]
    rows += [[name, version] for name, version in versions.items() if name != "torch"]
    lines = ["# Environment", ""] + table(["what", "version / value"], rows, align_right_from=2)
    lines += ["", "One 256 x 256 matmul on the device, relative error against fp64:", ""]
    lines += table(["precision", "relative error"], [[k, f"{v:.1e}" if isinstance(v, float) else v]
                                                     for k, v in smoke.items()])
    ok = all(isinstance(v, float) for v in smoke.values())
    return write_stage(out, "env", {"result": "ok" if ok else "a precision failed", **facts, "packages": versions,
                                    "nvidia_smi": smi, "matmul_relative_error": smoke}, lines)


def find_tests(given: Optional[str]) -> str:
    """``--tests``, or the checkout's ``tests/``."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tests = given or os.path.join(checkout, "tests")
    if not os.path.exists(os.path.join(tests, TEST_FILES[0])):
        raise CommandError(f"--tests: no {TEST_FILES[0]} under {tests} (an installed wheel has no test suite: "
                           "pass --tests CHECKOUT/tests of a clone of the same version)")
    return os.path.abspath(tests)


def split_test_id(name: str) -> Optional[Tuple[str, str, str]]:
    """``test_x[OPTION_SET-PRECISION]`` -> (function, option set, precision)."""
    function, _, params = name.partition("[")
    if function not in TEST_FUNCTIONS or not params.endswith("]"):
        return None
    for precision in sorted(TEST_FUNCTIONS[function][1], key=len, reverse=True):
        if params[:-1].endswith("-" + precision):
            return function, params[: -len(precision) - 2], precision
    return None


def read_junit(path: str) -> List[dict]:
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = ((child.get("message") or child.text or "").strip().splitlines() or [""])[0][:300]
        cases.append({"name": case.get("name"), "outcome": outcome, "message": message,
                      "seconds": float(case.get("time") or 0)})
    return cases


def outcome_matrix(cases: List[dict]) -> List[str]:
    columns = [(f, p) for f, (_, precisions) in TEST_FUNCTIONS.items() for p in precisions]
    cells: Dict[str, Dict[Tuple[str, str], str]] = {}
    for case in cases:
        parsed = split_test_id(case["name"])
        if parsed:
            function, option_set, precision = parsed
            cells.setdefault(option_set, {})[(function, precision)] = MARKS[case["outcome"]]
    header = ["option set"] + [f"{TEST_FUNCTIONS[f][0]}, {p}" for f, p in columns]
    return table(header, [[name] + [row.get(col) for col in columns] for name, row in cells.items()])


def run_tests(out: str, device, tests: Optional[str], quick: bool, time_limit: float, **_) -> List[str]:
    tests = find_tests(tests)
    junit = os.path.join(os.path.abspath(out), "tests-junit.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "--device", device.type,
           "--junitxml", junit, *(os.path.join(tests, f) for f in TEST_FILES)]
    cmd += ["-k", " or ".join(QUICK_OPTION_SETS)] if quick else []
    os.makedirs(out, exist_ok=True)
    returncode = run_logged(cmd, os.path.join(out, "tests.log"), time.time() + time_limit, cwd=os.path.dirname(tests),
                            append=False)
    cases = read_junit(junit) if os.path.exists(junit) else []
    counts = {k: sum(c["outcome"] == k for c in cases) for k in MARKS}
    result = ("ok" if returncode == 0 else f"pytest exit {returncode}") + ": " + ", ".join(
        f"{n} {k}" for k, n in counts.items() if n)
    shown = " ".join(["pytest", "--device", device.type, *("tests/" + f for f in TEST_FILES)])
    lines = ["# The model tests on the device", "",
             f"`{shown}`" + (" (`--quick`)" if quick else "") + f": {result}. Log: [tests.log](tests.log).", "",
             "Tolerances (tests/models/test_on_device.py): incremental = full to 1e-5 in fp32 (TF32 off), "
             "0.02 in fp16, 0.1 in bf16; beam search batched = alone: the same hypotheses in fp32; in half "
             "precision each hypothesis of the batch has the log-probabilities that a teacher-forced forward "
             "gives the sentence alone, within those tolerances. A training "
             "test passes when the parameters are in the flag's precision, every loss is finite and the loss "
             "falls.", ""]
    lines += outcome_matrix(cases)
    failures = [c for c in cases if c["outcome"] in ("failed", "error")]
    if failures:
        lines += ["", "## Failures", ""] + [f"- `{c['name']}`: {c['message']}" for c in failures]
    return write_stage(out, "tests", {"result": result, "command": cmd, "returncode": returncode, "counts": counts,
                                      "cases": cases}, lines)


def bench_table(runs: Dict[str, dict], dtypes: List[str], config: str, measure: str, thesis: Dict[str, float],
                title: str) -> List[str]:
    rows: Dict[str, Dict[str, dict]] = {}
    for dtype in dtypes:
        for rec in runs.get(f"{config}-{dtype}", {}).get("configs", []):
            rows.setdefault(rec["name"], {})[dtype] = rec
    if not rows:
        return [f"{title}: no measurement (see the logs)."]
    what = "training" if measure == "train" else "generation"
    peaked = [d for d in dtypes if any("cuda_peak_ratio" in r.get(d, {}) for r in rows.values())]
    header = ["row", "thesis (GPU)"] + [f"{what} speed, {d}" for d in dtypes] + ["speed by FLOPs"] + \
             [f"peak memory ratio, {d}" for d in peaked]
    body = []
    for name, by_dtype in rows.items():
        flops = next(iter(by_dtype.values()))["train_flops_ratio" if measure == "train" else "decode_flops_ratio"]
        peaks = [f"{by_dtype[d]['cuda_peak_ratio']:.2f}" if "cuda_peak_ratio" in by_dtype.get(d, {}) else None
                 for d in peaked]
        body.append([name, thesis.get(name)] + [speed(by_dtype[d][measure]) if measure in by_dtype.get(d, {})
                                                else None for d in dtypes] + [f"{1 / flops:.2f}"] + peaks)
    return [title, ""] + table(header, body)


def run_bench(out: str, device, quick: bool, time_limit: float, dtypes: Optional[List[str]] = None, **_) -> List[str]:
    dtypes = dtypes or (["fp16", "bf16"] if device.type == "cuda" else ["bf16"])
    plans = [("base", "tiny" if quick else "base", BASE_ROWS[:1] + BASE_ROWS[4:5] if quick else BASE_ROWS),
             ("small", "tiny" if quick else "small", SMALL_ROWS[:1] if quick else SMALL_ROWS)]
    runs, total_rows, start = {}, len(dtypes) * sum(len(rows) for _, _, rows in plans), time.time()
    os.makedirs(out, exist_ok=True)
    for config, size, rows in plans:
        for dtype in dtypes:
            name = f"{config}-{dtype}"
            json_path = os.path.join(os.path.abspath(out), f"bench-{name}.json")
            log = os.path.join(out, f"bench-{name}.log")
            cmd = [sys.executable, "-m", "fairseq_ext", "benchmark", "--config", size, "--device", device.type,
                   "--dtype", dtype, "--configs", *(f"{n}:{ROWS[n]}" for n in rows),
                   *(QUICK_BENCH if quick else ["--seconds", "2"]), "--json", json_path]
            share = (time_limit - (time.time() - start)) * len(rows) / total_rows  # time by rows
            total_rows -= len(rows)
            code = run_logged(cmd, log, time.time() + max(1.0, share), append=False)
            # the rows of a run stopped by the time limit are in its JSON all the same
            runs[name] = {"returncode": code, "command": cmd, **({"error": last_line(log)} if code else {}),
                          **read_json(json_path)}
    failed = {k: v.get("error") for k, v in runs.items() if v.get("returncode") != 0}
    settings = next((r for r in runs.values() if r.get("settings")), {}).get("settings", {})
    lines = ["# What each technique costs on this device", "",
             f"`fairseq-ext benchmark` on {device.type} in {', '.join(dtypes)}"
             + (" (`--quick`: tiny sizes, the numbers mean nothing)" if quick else "")
             + f"; batch {settings.get('batch')} x {settings.get('src_len')}/{settings.get('tgt_len')}, "
             f"decoding {settings.get('steps')} steps at beam {settings.get('beam')}. Every number is relative to "
             "fairseq's own `transformer` of the same size, timed interleaved in the same process. A speed is 1 / "
             "the time ratio (median of the pairs [interquartile range]); 0.71 means 71% of the stock's steps per "
             "second, as the thesis gives its overheads (its times were measured on GTX GPUs, ours here). The FLOPs "
             "column is the stock's FLOPs over the row's: the speed the arithmetic alone would give. Peak memory: "
             "the CUDA allocator's peak in a training step, counting the model's own parameters, gradients, "
             "activations and temporaries, over the stock's.", ""]
    lines += bench_table(runs, dtypes, "base", "train", THESIS_TRAIN,
                         f"**Training, {plans[0][1]} config** (thesis: training steps per second relative to its "
                         "baseline, base config)")
    lines += [""] + bench_table(runs, dtypes, "small", "generate_beam", THESIS_DECODE,
                                f"**Decoding, {plans[1][1]} config**: fairseq's beam search at beam "
                                f"{settings.get('beam')} (thesis: MS+AIF decoding speed with 1, 2, 3 auxiliary "
                                "decoders, small config)")
    if failed:
        lines += ["", "## Runs that failed or stopped", "",
                  "A run stopped by the time limit keeps the rows it finished (above)."]
        lines += [f"- {k}: {v}; rows finished: {len(runs[k].get('configs', []))}" for k, v in failed.items()]
    result = "ok" if not failed else f"{len(failed)} of {len(runs)} runs failed"
    return write_stage(out, "bench", {"result": result, "dtypes": dtypes, "quick": quick, "runs": runs}, lines)
