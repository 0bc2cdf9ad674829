"""The probing tasks (SentEval's ten, Conneau et al. 2018): SentEval's files read and written,
SentLen / WC / BShift generated from raw text by SentEval's rules, every task balanced over
its labels and split into tr / va / te, and the tasks a probing command's options name."""
import collections
import math
import os
import random
import unicodedata
from typing import Dict, List, Sequence, Tuple

from fairseq_ext.analysis import AnalysisError
from fairseq_ext.common import checkpoints, data_text
from fairseq_ext.common.data_text import recipe_tokenizer, unescape_moses
from fairseq_ext.errors import CheckpointError, DataError

# (thesis name, SentEval file, category), in the order of thesis Tables 4.8 / 5.5
TASKS = [
    ("SentLen", "sentence_length.txt", "Surface"),
    ("WC", "word_content.txt", "Surface"),
    ("TDep", "tree_depth.txt", "Syntactic"),
    ("BShift", "bigram_shift.txt", "Syntactic"),
    ("ToCo", "top_constituents.txt", "Syntactic"),
    ("Tense", "past_present.txt", "Semantic"),
    ("SubjN", "subj_number.txt", "Semantic"),
    ("ObjN", "obj_number.txt", "Semantic"),
    ("SoMo", "odd_man_out.txt", "Semantic"),
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
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for p in PARTITIONS:
            for label, sentence in data[p]:
                f.write(f"{p}\t{label}\t{sentence}\n")
    os.replace(tmp, path)


def is_punctuation(token: str) -> bool:
    return all(unicodedata.category(c)[0] in "PS" for c in token)


def sentlen_examples(sentences: Sequence[List[str]]) -> List[Tuple[str, str]]:
    """(bin, sentence) for every sentence whose token count falls in a SentEval bin."""
    out = []
    for tokens in sentences:
        for label, (lo, hi) in enumerate(SENTLEN_BINS):
            if lo <= len(tokens) <= hi:
                out.append((str(label), " ".join(tokens)))
    return out


def wc_targets(sentences: Sequence[List[str]], n_words: int = 1000, rank_start: int = 2000,
               min_chars: int = 4) -> List[str]:
    """The first ``n_words`` lower-cased words of at least ``min_chars`` characters from
    frequency rank ``rank_start`` + 1 on (ties: the earlier first occurrence first)."""
    counts = collections.Counter(t.lower() for tokens in sentences for t in tokens)
    ranked = [w for w, _ in counts.most_common()]
    return [w for w in ranked[rank_start:] if len(w) >= min_chars][:n_words]


def wc_examples(sentences: Sequence[List[str]], targets: Sequence[str]) -> List[Tuple[str, str]]:
    """(word, sentence) for the sentences holding exactly one target word, exactly once."""
    wanted = set(targets)
    out = []
    for tokens in sentences:
        hits = [t.lower() for t in tokens if t.lower() in wanted]
        if len(hits) == 1:
            out.append((hits[0], " ".join(tokens)))
    return out


def bshift_positions(tokens: Sequence[str]) -> List[int]:
    """Positions i (i, i+1 swappable): not the first token, no punctuation, different tokens."""
    return [i for i in range(1, len(tokens) - 1)
            if not is_punctuation(tokens[i]) and not is_punctuation(tokens[i + 1]) and tokens[i] != tokens[i + 1]]


def bshift_examples(sentences: Sequence[List[str]], rng: random.Random) -> List[Tuple[str, str]]:
    """Half the usable sentences with one random adjacent pair swapped (I), half as they are (O)."""
    usable = [list(t) for t in sentences if '"' not in t and bshift_positions(t)]
    rng.shuffle(usable)
    out = []
    for k, tokens in enumerate(usable):
        if k % 2 == 0:
            i = rng.choice(bshift_positions(tokens))
            tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
            out.append(("I", " ".join(tokens)))
        else:
            out.append(("O", " ".join(tokens)))
    return out


def balanced_split(examples: List[Tuple[str, str]], sizes: Sequence[int], rng: random.Random,
                   min_per_class: int = 3) -> Split:
    """Every label cut to the same count (the rarest label's, at most sum(sizes) / labels;
    labels with fewer than ``min_per_class`` examples dropped), then split per label in the
    proportions of ``sizes`` (tr, va, te), at least one va and one te example each."""
    by_label: Dict[str, List[str]] = collections.defaultdict(list)
    for label, sentence in examples:
        by_label[label].append(sentence)
    by_label = {k: v for k, v in by_label.items() if len(v) >= max(min_per_class, 3)}
    data: Split = {p: [] for p in PARTITIONS}
    if not by_label:
        return data
    per_label = min(min(len(v) for v in by_label.values()), math.ceil(sum(sizes) / len(by_label)))
    total = sum(sizes)
    for label in sorted(by_label):
        sents = by_label[label]
        rng.shuffle(sents)
        sents = sents[:per_label]
        n_va = max(1, round(per_label * sizes[1] / total))
        n_te = max(1, round(per_label * sizes[2] / total))
        data["te"] += [(label, s) for s in sents[:n_te]]
        data["va"] += [(label, s) for s in sents[n_te:n_te + n_va]]
        data["tr"] += [(label, s) for s in sents[n_te + n_va:]]
    for p in PARTITIONS:
        rng.shuffle(data[p])
    return data


def generate_tasks(sentences: Sequence[List[str]], tasks: Sequence[str], sizes: Sequence[int], seed: int = 1,
                   wc_words: int = 1000, wc_rank_start: int = 2000, min_per_class: int = 10) -> Dict[str, Split]:
    """SentLen / WC / BShift from tokenized sentences (duplicates removed first, so that no
    sentence is in two partitions)."""
    unique = list(dict.fromkeys(tuple(t) for t in sentences if t))
    out = {}
    for name in tasks:
        rng = random.Random(f"{seed}-{name}")
        if name == "SentLen":
            examples = sentlen_examples(unique)
        elif name == "WC":
            examples = wc_examples(unique, wc_targets(unique, wc_words, wc_rank_start))
        elif name == "BShift":
            examples = bshift_examples(unique, rng)
        else:
            raise AnalysisError(f"--generate: {name} needs a parser or a language model; give its SentEval file")
        data = balanced_split(examples, sizes, rng, min_per_class)
        if len({label for label, _ in data["tr"]}) < 2:
            raise AnalysisError(f"--corpus: too few sentences for {name} ({len(examples)} usable)")
        out[name] = data
    return out


def load_tasks(args, out: str) -> Dict[str, Split]:
    """The tasks the probing command's options name (--senteval, --task, --corpus with
    --generate), in the order of the thesis' tables; generated ones are written to OUT/tasks/."""
    tasks: Dict[str, Split] = {}
    if args.senteval:
        if not os.path.isdir(args.senteval):
            raise AnalysisError(f"--senteval {args.senteval}: no such directory")
        for name, filename, _ in TASKS:
            path = os.path.join(args.senteval, filename)
            if os.path.exists(path):
                tasks[name] = read_senteval(path)
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
        lines = data_text.read_lines(args.corpus)
        if args.corpus_lines:
            lines = lines[: args.corpus_lines]
        sentences = [tok(line) for line in lines]
        wanted = [t for t in args.generate if t not in tasks]
        generated = generate_tasks(sentences, wanted, args.sizes, args.seed, args.wc_words, args.wc_rank_start,
                                   args.min_per_class)
        for name, data in generated.items():
            write_senteval(data, os.path.join(out, "tasks", dict((n, f) for n, f, _ in TASKS)[name]))
        tasks.update(generated)
    if not tasks:
        raise AnalysisError("no probing task: give --senteval DIR, --task NAME=FILE or --corpus FILE")
    known = [n for n, _, _ in TASKS]
    return dict(sorted(tasks.items(), key=lambda kv: known.index(kv[0]) if kv[0] in known else len(known)))
