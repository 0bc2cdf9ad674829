"""Linguistic probing of the encoder (thesis Sec. 4.5.4 / 5.6.1, Tables 4.8 and 5.5; the ten probing tasks of Conneau et
al. 2018, SentEval).

The model is frozen. Each sentence is encoded with the model's own pipeline (the recipe's Moses tokenization and BPE /
SentencePiece model from DATA/prep.env, then the model's dictionary); its representation is the mean over its positions
(every source token and the end-of-sentence token the encoder always sees, padding excluded) of one encoder layer
(``--layer``: 0 = embeddings, L = top, -1 = top; the top layer is the encoder's output, and in a pre-norm model every
layer goes through the encoder's final LayerNorm as the top one does). A two-layer MLP (SentEval's: Linear, dropout,
sigmoid, Linear; L2 ``--l2`` on the hidden layer, as the thesis) is trained on the task's ``tr`` split with RMSprop,
early-stopped on ``va`` accuracy; the table gives the accuracy on ``te`` (``--split valid``: on ``va``).

Tasks come from two places:

- SentEval probing files (``--senteval DIR``, the ``data/probing`` directory of SentEval, or
  ``--task NAME=FILE``): ``partition <TAB> label <TAB> sentence`` per line, partition
  tr/va/te; every one of the ten files found in DIR is used;
- generated from any raw corpus (``--corpus FILE``, plain or .gz) by the rules SentEval's
  README gives, for the tasks that need only text:

  SentLen  the number of (Moses) tokens, binned 0: 5-8, 1: 9-12, 2: 13-16, 3: 17-20,
           4: 21-25, 5: 26-28 (other lengths left out);
  WC       1000 target words: the lower-cased corpus words of at least 4 characters taken
           in frequency-rank order from rank 2001 on (``--wc-rank-start``, ``--wc-words``);
           a sentence qualifies when it contains exactly one target word, exactly once;
           the label is the word;
  BShift   two adjacent tokens swapped (label I) or the sentence as is (label O), half
           each; never the first token or a punctuation token, never two equal tokens,
           and sentences with double quotes are left out.

The other seven tasks need a constituency parser (TreeDepth, TopConst, Tense, SubjNum, ObjNum, CoordInv: depth, top
constituents, the main verb's tense, the main clause's subject / object and its top-level coordination) or a language
model and POS tagger (SOMO's frequency-matched noun/verb replacements); no rule on raw text reproduces them, so they are
only read from SentEval's files. Generated tasks are balanced over their labels (every label cut to the rarest one's
count, labels with fewer than ``--min-per-class`` sentences dropped), split 10:1:1 per label (``--sizes``, SentEval:
100k/10k/10k), and written in SentEval's format to OUT/tasks/ so that they can be inspected and reused.

    python -m fairseq_ext.analysis.probing --checkpoint base/checkpoint_best.pt ms1/checkpoint_best.pt \\
        --names Transformer MS-1 --data data-bin/wmt14.en-de --senteval SentEval/data/probing --out analysis/probing
    python -m fairseq_ext.analysis.probing --checkpoint base/checkpoint_best.pt --data data-bin/multi30k.en-de \\
        --corpus /data/mt/multi30k/train.en.gz --wc-rank-start 500 --wc-words 300 --out analysis/probing

Writes probing.{md,csv,json} (category, task, labels, train/test sizes, the majority-label
accuracy, one column per model and layer; #AVG rows per category as the thesis' tables) and
probing.png (accuracy per task and model; per layer when several layers are probed; every
accuracy with its 95% Wilson score interval over the task's test sentences, whose number is
the table's "test" column).
"""
import collections
import math
import os
import random
import sys
import unicodedata
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from fairseq.data import data_utils

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.capture import layer_outputs, primary_encoder
from fairseq_ext.analysis.figures import (FigureContext, add_caption, add_title, legend_outside, names_for, pyplot,
                                         save_figure, system_colours, wilson_interval)
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints, data_text
from fairseq_ext.common.data_text import TextPipeline, recipe_tokenizer, unescape_moses
from fairseq_ext.errors import CheckpointError, DataError

ANALYSIS = Analysis("probing", "Linguistic probing", "thesis Tables 4.8, 5.5", order=70)

# (thesis name, SentEval file, category), in the order of thesis Tables 4.8 / 5.5
TASKS = [
    ("SentLen", "sentence_length.txt", "Surface"), ("WC", "word_content.txt", "Surface"),
    ("TDep", "tree_depth.txt", "Syntactic"), ("BShift", "bigram_shift.txt", "Syntactic"),
    ("ToCo", "top_constituents.txt", "Syntactic"),
    ("Tense", "past_present.txt", "Semantic"), ("SubjN", "subj_number.txt", "Semantic"),
    ("ObjN", "obj_number.txt", "Semantic"), ("SoMo", "odd_man_out.txt", "Semantic"),
    ("CoIn", "coordination_inversion.txt", "Semantic"),
]
CATEGORY = {name: cat for name, _, cat in TASKS}
GENERATED = ("SentLen", "WC", "BShift")
PARTITIONS = ("tr", "va", "te")
SENTLEN_BINS = [(5, 8), (9, 12), (13, 16), (17, 20), (21, 25), (26, 28)]
Split = Dict[str, List[Tuple[str, str]]]  # partition -> [(label, sentence)]


def read_senteval(path: str) -> Split:
    """A SentEval probing file: ``partition <TAB> label <TAB> ... <TAB> sentence``."""
    data: Split = {p: [] for p in PARTITIONS}
    for number, line in enumerate(data_text.read_lines(path), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 3 or fields[0] not in data:
            raise AnalysisError(f"{path}:{number}: expected 'tr|va|te<TAB>label<TAB>sentence'")
        data[fields[0]].append((fields[1], fields[-1].strip()))
    for p in PARTITIONS:  # va too: the probe is early-stopped on it
        if not data[p]:
            raise AnalysisError(f"{path}: no '{p}' sentences")
    return data


def write_senteval(data: Split, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(f"{p}\t{label}\t{sentence}\n" for p in PARTITIONS for label, sentence in data[p])
    os.replace(path + ".tmp", path)


def is_punctuation(token: str) -> bool:
    return all(unicodedata.category(c)[0] in "PS" for c in token)


def task_examples(name: str, sentences: Sequence[Tuple[str, ...]], rng: random.Random, wc_words: int = 1000,
                  wc_rank_start: int = 2000) -> List[Tuple[str, str]]:
    """(label, sentence) of the generated task ``name`` by the rules of the module docstring (WC's
    frequency ties: the earlier first occurrence first)."""
    if name == "SentLen":
        return [(str(label), " ".join(tokens)) for tokens in sentences
                for label, (lo, hi) in enumerate(SENTLEN_BINS) if lo <= len(tokens) <= hi]
    if name == "WC":
        counts = collections.Counter(t.lower() for tokens in sentences for t in tokens)
        wanted = set([w for w, _ in counts.most_common()[wc_rank_start:] if len(w) >= 4][:wc_words])
        hits = [([t.lower() for t in tokens if t.lower() in wanted], tokens) for tokens in sentences]
        return [(found[0], " ".join(tokens)) for found, tokens in hits if len(found) == 1]
    if name != "BShift":
        raise AnalysisError(f"--generate: {name} needs a parser or a language model; give its SentEval file")

    def positions(tokens):
        return [i for i in range(1, len(tokens) - 1) if not is_punctuation(tokens[i])
                and not is_punctuation(tokens[i + 1]) and tokens[i] != tokens[i + 1]]

    usable = [list(t) for t in sentences if '"' not in t and positions(t)]
    rng.shuffle(usable)
    out = []
    for k, tokens in enumerate(usable):
        if k % 2 == 0:
            i = rng.choice(positions(tokens))
            tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
        out.append(("I" if k % 2 == 0 else "O", " ".join(tokens)))
    return out


def balanced_split(examples: List[Tuple[str, str]], sizes: Sequence[int], rng: random.Random,
                   min_per_class: int = 3) -> Split:
    """Every label cut to the rarest one's count (at most sum(sizes) / labels; labels under
    ``min_per_class`` dropped), split per label as ``sizes`` (tr, va, te), at least one va and te each."""
    by_label: Dict[str, List[str]] = collections.defaultdict(list)
    for label, sentence in examples:
        by_label[label].append(sentence)
    by_label = {k: v for k, v in by_label.items() if len(v) >= max(min_per_class, 3)}
    data: Split = {p: [] for p in PARTITIONS}
    if not by_label:
        return data
    total = sum(sizes)
    per_label = min(min(len(v) for v in by_label.values()), math.ceil(total / len(by_label)))
    n_va, n_te = max(1, round(per_label * sizes[1] / total)), max(1, round(per_label * sizes[2] / total))
    for label in sorted(by_label):
        sents = by_label[label]
        rng.shuffle(sents)
        sents = sents[:per_label]
        data["te"] += [(label, s) for s in sents[:n_te]]
        data["va"] += [(label, s) for s in sents[n_te:n_te + n_va]]
        data["tr"] += [(label, s) for s in sents[n_te + n_va:]]
    for p in PARTITIONS:
        rng.shuffle(data[p])
    return data


def generate_tasks(sentences: Sequence[List[str]], tasks: Sequence[str], sizes: Sequence[int], seed: int = 1,
                   wc_words: int = 1000, wc_rank_start: int = 2000, min_per_class: int = 10) -> Dict[str, Split]:
    """SentLen / WC / BShift from tokenized sentences (duplicates removed: none in two partitions)."""
    unique = list(dict.fromkeys(tuple(t) for t in sentences if t))
    out = {}
    for name in tasks:
        rng = random.Random(f"{seed}-{name}")
        examples = task_examples(name, unique, rng, wc_words, wc_rank_start)
        out[name] = balanced_split(examples, sizes, rng, min_per_class)
        if len({label for label, _ in out[name]["tr"]}) < 2:
            raise AnalysisError(f"--corpus: too few sentences for {name} ({len(examples)} usable)")
    return out


def load_tasks(args, out: str) -> Dict[str, Split]:
    """The tasks of --senteval, --task and --corpus, in the thesis' order; generated ones written to OUT/tasks/."""
    tasks: Dict[str, Split] = {}
    if args.senteval:
        if not os.path.isdir(args.senteval):
            raise AnalysisError(f"--senteval {args.senteval}: no such directory")
        tasks = {name: read_senteval(os.path.join(args.senteval, filename)) for name, filename, _ in TASKS
                 if os.path.exists(os.path.join(args.senteval, filename))}
        if not tasks:
            raise AnalysisError(f"--senteval {args.senteval}: none of the SentEval probing files "
                                f"({', '.join(f for _, f, _ in TASKS)})")
    for spec in args.task or []:
        name, sep, path = spec.partition("=")
        if not sep or not path:
            raise AnalysisError(f"--task {spec}: expected NAME=FILE")
        if not os.path.exists(path):
            raise AnalysisError(f"--task {spec}: no such file")
        tasks[name] = read_senteval(path)
    if args.corpus:
        if not os.path.exists(args.corpus):
            raise AnalysisError(f"--corpus {args.corpus}: no such file")
        try:  # the source language's Moses rules (English when nothing tells the language)
            lang = checkpoints.languages(args.checkpoint[0], args.data, args.split)[0]
        except (CheckpointError, DataError):
            lang = "en"
        tok = (lambda line: unescape_moses(line).split()) if args.corpus_tokenized else \
            (lambda line, t=recipe_tokenizer(lang, escape=False): t(line).split())
        lines = data_text.read_lines(args.corpus)[:args.corpus_lines or None]
        generated = generate_tasks([tok(line) for line in lines], [t for t in args.generate if t not in tasks],
                                   args.sizes, args.seed, args.wc_words, args.wc_rank_start, args.min_per_class)
        for name, data in generated.items():
            write_senteval(data, os.path.join(out, "tasks", next(f for n, f, _ in TASKS if n == name)))
        tasks.update(generated)
    if not tasks:
        raise AnalysisError("no probing task: give --senteval DIR, --task NAME=FILE or --corpus FILE")
    known = [n for n, _, _ in TASKS]
    return dict(sorted(tasks.items(), key=lambda kv: known.index(kv[0]) if kv[0] in known else len(known)))


@torch.no_grad()
def pooled_features(model, pipeline: TextPipeline, sentences: Sequence[str], layers: Sequence[int],
                    max_tokens: int = 6000) -> Dict[int, torch.Tensor]:
    """layer -> N x C: the mean of encoder layer l over each sentence's positions."""
    encoder = primary_encoder(model)
    dev = next(model.parameters()).device
    pad = pipeline.dictionary.pad()
    ids = [pipeline(s) for s in sentences]
    order = sorted(range(len(ids)), key=lambda i: ids[i].numel())
    out = {l: torch.zeros(len(ids), encoder.embed_tokens.embedding_dim) for l in layers}
    start = 0
    while start < len(order):
        end = start + 1  # sorted by length: a batch of k sentences is k times its last one's length
        while end < len(order) and ids[order[end]].numel() * (end - start + 1) <= max_tokens:
            end += 1
        batch = [ids[i] for i in order[start:end]]
        tokens = data_utils.collate_tokens(batch, pad, left_pad=True).to(dev)
        lengths = torch.tensor([b.numel() for b in batch], device=dev)
        states = layer_outputs(encoder, encoder(tokens, src_lengths=lengths, return_all_hiddens=True))
        keep = tokens.ne(pad).t().unsqueeze(-1).float()  # T x B x 1
        for l in layers:
            out[l][torch.tensor(order[start:end])] = ((states[l].float() * keep).sum(0) / keep.sum(0)).cpu()
        start = end
    return out


def mlp_probe(dim: int, num_labels: int, hidden: int = 200, dropout: float = 0.0) -> nn.Sequential:
    """SentEval's MLP (``hidden`` 0: logistic regression)."""
    if hidden <= 0:
        return nn.Sequential(nn.Linear(dim, num_labels))
    return nn.Sequential(nn.Linear(dim, hidden), nn.Dropout(dropout), nn.Sigmoid(), nn.Linear(hidden, num_labels))


@torch.no_grad()
def accuracy(probe: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 4096) -> float:
    probe.eval()
    if len(y) == 0:
        return float("nan")
    return sum(int((probe(x[i:i + batch_size]).argmax(-1) == y[i:i + batch_size]).sum())
               for i in range(0, len(y), batch_size)) / len(y)


def train_probe(x_tr, y_tr, x_va, y_va, num_labels: int, hidden: int = 200, dropout: float = 0.0,
                l2: float = 1e-4, lr: float = 1e-3, batch_size: int = 512, max_epochs: int = 100,
                patience: Optional[int] = None, seed: int = 1) -> Tuple[nn.Sequential, dict]:
    """RMSprop on cross-entropy, L2 ``l2`` on the hidden layer's weights; the best validation epoch's parameters are
    kept, and with ``patience`` training stops after that many epochs without a better one."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    probe = mlp_probe(x_tr.size(1), num_labels, hidden, dropout)
    rest = [p for p in probe.parameters() if p is not probe[0].weight]
    optimizer = torch.optim.RMSprop([{"params": [probe[0].weight], "weight_decay": l2},
                                     {"params": rest, "weight_decay": 0.0}], lr=lr)
    best, best_state, best_epoch, epoch = -1.0, None, 0, 0
    for epoch in range(1, max_epochs + 1):
        probe.train()
        perm = torch.randperm(len(y_tr), generator=gen)
        for i in range(0, len(perm), batch_size):
            idx = perm[i:i + batch_size]
            loss = nn.functional.cross_entropy(probe(x_tr[idx]), y_tr[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        acc = accuracy(probe, x_va, y_va)
        if acc > best:
            best, best_epoch = acc, epoch
            best_state = {k: v.clone() for k, v in probe.state_dict().items()}
        elif patience and epoch - best_epoch >= patience:
            break
    probe.load_state_dict(best_state)
    return probe, {"valid": best, "epochs": epoch, "best_epoch": best_epoch}


def probe_task(features: Dict[str, torch.Tensor], data: Split, report: str = "te", **train_args) -> dict:
    """Train on tr (a label absent from tr counts as an error), early-stop on va, accuracy on ``report``."""
    labels = sorted({label for label, _ in data["tr"]})
    index = {label: i for i, label in enumerate(labels)}
    y = {p: torch.tensor([index.get(label, -1) for label, _ in data[p]], dtype=torch.long) for p in PARTITIONS}
    probe, info = train_probe(features["tr"], y["tr"], features["va"], y["va"], len(labels), **train_args)
    majority = collections.Counter(label for label, _ in data["tr"]).most_common(1)[0][0]
    n = len(data[report])
    return {"accuracy": accuracy(probe, features[report], y[report]), "valid": info["valid"],
            "epochs": info["epochs"], "labels": len(labels),
            "majority": sum(label == majority for label, _ in data[report]) / n if n else float("nan")}


def summary_rows(results: Dict[str, Dict[str, dict]], tasks: Dict[str, Split], columns: List[str],
                 report: str) -> List[dict]:
    """A row per task by category (thesis layout), a category of several tasks followed by #AVG."""
    task_rows = []
    for name, data in tasks.items():
        first = results[columns[0]][name]
        task_rows.append({"category": CATEGORY.get(name, "other"), "task": name, "labels": first["labels"],
                          "train": len(data["tr"]), "test": len(data[report]),
                          "majority": round(100 * first["majority"], 2),
                          **{c: round(100 * results[c][name]["accuracy"], 2) for c in columns}})
    rows = []
    for cat in ("Surface", "Syntactic", "Semantic", "other"):
        sel = [r for r in task_rows if r["category"] == cat]
        rows += sel
        if len(sel) > 1 and cat != "other":
            rows.append({"category": cat, "task": "#AVG", "labels": None, "train": None, "test": None,
                         **{c: round(sum(r[c] for r in sel) / len(sel), 2) for c in ["majority", *columns]}})
    return rows


def error_bars(accuracies: Sequence[float], sizes: Sequence[int]) -> List[List[float]]:
    """matplotlib's yerr of accuracies (%): each one's 95% Wilson interval over its ``sizes`` sentences."""
    spans = [wilson_interval(round(a * n / 100), n) for a, n in zip(accuracies, sizes)]
    return [[a - 100 * lo for a, (lo, _) in zip(accuracies, spans)],
            [100 * hi - a for a, (_, hi) in zip(accuracies, spans)]]


def plot(rows: List[dict], columns: List[str], layer_columns: Dict[str, List[Tuple[int, str]]], path: str,
         context: Optional[FigureContext] = None):
    """Accuracy per task and model (bars, the majority label marked), or per layer, one panel per
    model, when several layers are probed; each with its 95% Wilson interval."""
    plt = pyplot()
    task_rows = [r for r in rows if r["task"] != "#AVG"]
    if any(len(v) > 1 for v in layer_columns.values()):
        fig, axes = plt.subplots(1, len(layer_columns), figsize=(5 * len(layer_columns), 3.5), squeeze=False)
        for ax, (model, cols) in zip(axes[0], layer_columns.items()):
            for r in task_rows:
                acc = [r[c] for _, c in cols]
                ax.errorbar([l for l, _ in cols], acc, yerr=error_bars(acc, [r["test"]] * len(acc)), marker="o",
                            capsize=3, label=f"{r['task']} (n = {r['test']})")
            ax.set(xlabel="encoder layer", ylabel="probing accuracy (%)", title=model)
        legend_outside(axes[0][-1], fontsize=7)
    else:
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(task_rows) * max(1, len(columns)) / 2 + 1.5), 3.8))
        colours = system_colours(columns)
        width = 0.8 / len(columns)
        for k, c in enumerate(columns):
            ax.bar([i + k * width for i in range(len(task_rows))], [r[c] for r in task_rows], width, label=c,
                   color=colours[c], yerr=error_bars([r[c] for r in task_rows], [r["test"] for r in task_rows]),
                   capsize=2, error_kw={"linewidth": 0.8})
        centres = [i + 0.4 - width / 2 for i in range(len(task_rows))]
        ax.scatter(centres, [r["majority"] for r in task_rows], marker="_", s=300, color="black",
                   label="majority label", zorder=3)
        ax.set_xticks(centres, [f"{r['task']}\n(n = {r['test']})" for r in task_rows])
        ax.set(ylabel="probing accuracy (%)", ylim=(0, 100))
        legend_outside(ax, fontsize=7)
    add_title(fig, "Probing accuracy of the frozen encoder per task")
    sizes = ", ".join(f"{r['task']} {r['test']}" for r in task_rows)
    add_caption(fig, "Accuracy (%) of an MLP on the mean-pooled encoder layer, on each task's test sentences "
                     f"(n: {sizes}). Error bars: 95% Wilson score intervals of each accuracy over its task's n "
                     "sentences. Black dash: the accuracy of always answering the majority label.",
                width=max(fig.get_figwidth(), 6.5))
    return save_figure(fig, path, context)


def build_parser():
    ap = command.parser(__doc__)
    g = ap.add_argument_group("tasks")
    g.add_argument("--senteval", help="SentEval's data/probing directory (any of its ten files)")
    g.add_argument("--task", nargs="+", help="NAME=FILE, a file in SentEval's format")
    g.add_argument("--corpus", help="raw text (one sentence a line, .gz allowed) to generate SentLen, WC, BShift from")
    g.add_argument("--corpus-tokenized", action="store_true", help="the corpus is Moses-tokenized already")
    g.add_argument("--corpus-lines", type=int, help="read only the first N lines of --corpus")
    g.add_argument("--generate", nargs="+", default=list(GENERATED), choices=list(GENERATED))
    g.add_argument("--sizes", nargs=3, type=int, default=[100000, 10000, 10000], metavar=("TRAIN", "VALID", "TEST"))
    g.add_argument("--wc-words", type=int, default=1000)
    g.add_argument("--wc-rank-start", type=int, default=2000)
    g.add_argument("--min-per-class", type=int, default=10)
    g.add_argument("--seed", type=int, default=1)
    g = ap.add_argument_group("representation and classifier")
    g.add_argument("--layer", type=int, nargs="+", default=[-1],
                   help="encoder layer(s): 0 = embeddings, L = top, negative from the top (default -1)")
    g.add_argument("--hidden", type=int, default=200, help="hidden units of the MLP (0: logistic regression)")
    g.add_argument("--dropout", type=float, default=0.0)
    g.add_argument("--l2", type=float, default=1e-4, help="L2 on the hidden layer (thesis: 1e-4)")
    g.add_argument("--lr", type=float, default=1e-3, help="RMSprop learning rate (thesis Ch. 4: 1e-3, Ch. 5: 2.5e-4)")
    g.add_argument("--batch-size", type=int, default=512, help="thesis Ch. 4: 512, Ch. 5: 64")
    g.add_argument("--max-epoch", type=int, default=100)
    g.add_argument("--patience", type=int, help="stop after N epochs without a better validation accuracy "
                   "(default: all --max-epoch epochs; the best validation epoch is kept either way)")
    return ap


def execute(args, figures: FigureContext):
    report = {"test": "te", "te": "te", "valid": "va", "va": "va"}.get(args.split)
    if report is None:
        raise AnalysisError(f"--split {args.split}: probing reports on the tasks' test (te) or valid (va) sentences")
    tasks = load_tasks(args, args.out)
    # its figures name the tasks, not the split of --data
    figures = FigureContext.of(args, "the probing tasks " + ", ".join(
        f"{t} ({len(d['tr']):,}/{len(d['va']):,}/{len(d['te']):,})" for t, d in tasks.items())
        + f", reported on their {'test' if report == 'te' else 'validation'} sentences ({report})")
    results: Dict[str, Dict[str, dict]] = {}
    layer_columns: Dict[str, List[Tuple[int, str]]] = {}
    train_args = dict(hidden=args.hidden, dropout=args.dropout, l2=args.l2, lr=args.lr, batch_size=args.batch_size,
                      max_epochs=args.max_epoch, patience=args.patience, seed=args.seed)
    for name, ckpt in zip(names_for(args.checkpoint, args.names), args.checkpoint):
        model, task = checkpoints.load_model(ckpt, args.data, cpu=args.cpu)
        encoder = primary_encoder(model)
        pipeline = TextPipeline(args.data, task.source_dictionary, encoder.max_positions())
        num_layers = len(encoder.layers)
        for l in args.layer:
            if not -num_layers - 1 <= l <= num_layers:
                raise AnalysisError(f"--layer {l}: the encoder has layers 0 (embeddings) to {num_layers}")
        layers = sorted({l % (num_layers + 1) for l in args.layer})
        cols = layer_columns[name] = [(l, name if len(layers) == 1 else f"{name} L{l}") for l in layers]
        print(f"{name}: encoding with {pipeline.description}, layers {layers}", file=sys.stderr)
        for task_name, data in tasks.items():
            feats = {p: pooled_features(model, pipeline, [s for _, s in data[p]], layers) for p in PARTITIONS}
            for l, col in cols:
                res = results.setdefault(col, {})[task_name] = probe_task({p: feats[p][l] for p in PARTITIONS},
                                                                          data, report, **train_args)
                print(f"  {col} {task_name}: {100 * res['accuracy']:.2f} (valid {100 * res['valid']:.2f}, "
                      f"{res['epochs']} epochs)", file=sys.stderr)
    columns = [c for cols in layer_columns.values() for _, c in cols]
    rows = summary_rows(results, tasks, columns, report)
    command.write_table(rows, args.out, "probing", f"Probing accuracy (%) on {report}")
    plot(rows, columns, layer_columns, os.path.join(args.out, "probing.png"), figures)
    print(f"written: {args.out}/probing.{{md,csv,json}}" + (", tasks/" if args.corpus else ""))


main = command.main(build_parser, execute)

if __name__ == "__main__":
    sys.exit(main())
