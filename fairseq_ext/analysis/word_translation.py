"""Word-translation accuracy of every encoder and decoder layer (Xu et al. 2020, "Analyzing Word Translation of
Transformer Layers", Sec. 2-3, Tables 1, 3 and 5).

The trained model is frozen. For each analysed layer a d x d linear projection without bias (initialised to the
identity) is trained to map the layer's output into the model's own classifier (``decoder.output_layer``: the tied
output embedding, after the model's pre-classifier projection if it has one); the only trained parameters are the
projections and the alignment weights w. Layers are analysed independently (each has its own projection and w; they are
trained side by side on the same batches, which is the same as training them one after another since no parameter is
shared).

- Decoder layer l (0 = the target embeddings): its output at target position t, given the
  gold prefix y_<t (teacher forcing, the shifted target), predicts y_t. In a pre-norm model
  every layer's output goes through the decoder's final LayerNorm first, as the last one's
  does, so that the last layer with the identity projection is the model itself.
- Encoder layer l (0 = the source embeddings; pre-norm: through the encoder's final
  LayerNorm): aligned to the target by the cross-attention of the teacher-forced decoder.
  The M x H attention matrices A_i (every head of every decoder layer, T x S) are merged
  with p = softmax(w) (Eq. 1), A = sum_i p_i A_i (Eq. 2), and T_E = A E (Eq. 3, the paper's
  A^T x E with A stored source x target), one row per target position, predicting y_t.
- Decoder layer l with its self-attention or cross-attention sublayer bypassed ("-Self
  attention", "-Cross attention"): a temporary forward hook replaces the sublayer module's
  output by zeros, so the layer computes the residual path alone for that sublayer
  (x + 0, then the post-norm LayerNorm where the model has one) and the other sublayer and
  the FFN as usual; the layers below are unchanged. (Serial multi-source / multi-layer
  models: only the top cross-attention sublayer, ``encoder_attn``, is bypassed and read.)

Accuracy: the argmax of the classifier over the whole vocabulary equals y_t, counted over every target token of the
split including the end-of-sentence token (padding excluded). The projections (and w) are trained with cross-entropy on
``--train-split``; after every ``--validate-interval`` updates and every epoch each probe's accuracy on
``--valid-split`` is measured and its best parameters kept (early stopping per probe); the table reports ``--split``.
Delta is the gain over the layer below (Table 1's "Delta"); for the bypassed sublayers it is the loss against the same
layer computed in full.

    python -m fairseq_ext.analysis.word_translation --checkpoint base/checkpoint_best.pt \\
        --data data-bin/wmt14.en-de --split test --out analysis/wt [--max-train-sentences 200000]

Writes word_translation.{md,csv,json} (Table 1 / 5 layout), last_layer.{md,csv,json}
(Table 3: the last decoder layer through the projection vs the model's own teacher-forced
accuracy), word_translation.png (accuracy per layer: encoder, decoder, -self, -cross) and
projections.pt (every trained projection and w; ``translate_from_layer --projections``
reads it).
"""
import contextlib
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn as nn

from fairseq_ext.analysis import AnalysisError, command
from fairseq_ext.analysis.capture import capture_cross_attention, layer_outputs, primary_encoder
from fairseq_ext.analysis.figures import FigureContext, layer_axes, pyplot, save_figure
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.common import checkpoints
from fairseq_ext.guards.checkpoint_safety import load_checkpoint_state, save_atomically

ANALYSIS = Analysis("word_translation", "Word-translation accuracy per layer",
                    "Xu et al. 2020, Sec. 2-3, Tables 1, 3, 5", single=True, order=80)
PARTS = ("encoder", "decoder", "self", "cross")
SUBLAYER = {"self": "self_attn", "cross": "encoder_attn"}
NO_CROSS_ATTENTION = "the decoder has no cross-attention: encoder layers cannot be aligned (--parts)"


class LayerProbe(nn.Module):
    """One layer's projection into the classifier's input (identity at first when square) and,
    for an encoder layer, the alignment weights w (one per decoder layer x head, zero: uniform)."""

    def __init__(self, dim_in: int, dim_out: int, alignment_size: Optional[int] = None):
        super().__init__()
        self.projection = nn.Linear(dim_in, dim_out, bias=False)
        if dim_in == dim_out:
            nn.init.eye_(self.projection.weight)
        else:
            nn.init.xavier_uniform_(self.projection.weight)
        self.w = nn.Parameter(torch.zeros(alignment_size)) if alignment_size else None

    def forward(self, features: torch.Tensor, attentions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """B x T x C, or B x S x C aligned by B x K x T x S attentions: A = sum_i softmax(w)_i A_i
        (Eq. 1-2, K = decoder layers x heads, layer-major), T_E = A E (Eq. 3) -> B x T x C'."""
        if self.w is not None:
            alignment = torch.einsum("k,bkts->bts", torch.softmax(self.w.float(), dim=0), attentions.float())
            features = torch.bmm(alignment, features.float())
        return self.projection(features)


class _Stop(Exception):
    pass


def decoder_layers(model):
    layers = getattr(model.decoder, "layers", None)
    if layers is None:
        raise AnalysisError("the model's decoder has no layers to analyse")
    return layers


def classifier_input(decoder, state: torch.Tensor) -> torch.Tensor:
    """A decoder layer's output (T x B x C) as the classifier reads the last one, B x T x C."""
    if getattr(decoder, "layer_norm", None) is not None:
        state = decoder.layer_norm(state)
    state = state.transpose(0, 1)
    return decoder.project_out_dim(state) if getattr(decoder, "project_out_dim", None) is not None else state


def layer_output(model, layer_index: int, prev_output_tokens, encoder_out, sublayer: Optional[str] = None):
    """Decoder layer ``layer_index`` (0-based)'s output, T x B x C, with ``sublayer`` ("self_attn" |
    "encoder_attn") outputting zeros, so that only the residual path is left around it."""
    layer = decoder_layers(model)[layer_index]
    captured = {}

    def stop(module, args, output):
        captured["x"] = output[0]
        raise _Stop

    hooks = [layer.register_forward_hook(stop)]
    if sublayer:
        hooks.append(getattr(layer, sublayer).register_forward_hook(
            lambda module, args, output: (torch.zeros_like(output[0]),) + tuple(output[1:])))
    try:
        model.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=True)
    except _Stop:
        pass
    finally:
        for hook in hooks:
            hook.remove()
    return captured["x"]


def probe_names(num_encoder_layers: int, num_decoder_layers: int, parts: Sequence[str]) -> List[str]:
    return ([f"enc{l}" for l in range(num_encoder_layers + 1)] if "encoder" in parts else []) + \
        ([f"dec{l}" for l in range(num_decoder_layers + 1)] if "decoder" in parts else []) + \
        [f"dec{l}-{part}" for part in ("self", "cross") if part in parts for l in range(1, num_decoder_layers + 1)]


@torch.no_grad()
def frozen_features(model, sample, names: Sequence[str]) -> Dict[str, object]:
    """``enc<l>`` -> B x S x C, ``attn`` -> B x K x T x S, ``dec<l>[-self|-cross]`` -> B x T x C and
    ``model`` -> the model's own classifier input, for one batch."""
    net = {k: v for k, v in sample["net_input"].items() if k != "prev_output_tokens"}
    prev = sample["net_input"]["prev_output_tokens"]
    encoder_out = model.encoder(**net, return_all_hiddens=True)
    want_enc = any(n.startswith("enc") for n in names)
    with capture_cross_attention(model, missing=NO_CROSS_ATTENTION) if want_enc else contextlib.nullcontext() \
            as records:
        x, extra = model.decoder(prev, encoder_out=encoder_out, features_only=True)
    out: Dict[str, object] = {"model": x}
    if want_enc:
        if hasattr(model.encoder, "encoder_for"):
            raise AnalysisError("--parts encoder: a multi-source model's cross-attention reads several sources; "
                                "analyse its decoder layers (--parts decoder self cross)")
        states = layer_outputs(primary_encoder(model), encoder_out)
        attn = torch.cat([records[i]["attention"] for i in sorted(records)], dim=1)  # B x (M H) x T x S, layer-major
        if attn.size(-1) != states[0].size(0):
            raise AnalysisError("--parts encoder: the cross-attention is not over the source positions "
                                f"({attn.size(-1)} keys for {states[0].size(0)} source tokens)")
        out["attn"] = attn
        out.update({f"enc{l}": s.transpose(0, 1) for l, s in enumerate(states) if f"enc{l}" in names})
    inner = extra["inner_states"]
    out.update({f"dec{l}": classifier_input(model.decoder, s) for l, s in enumerate(inner) if f"dec{l}" in names})
    for part, sublayer in SUBLAYER.items():
        for l in range(1, len(inner)):
            if f"dec{l}-{part}" in names:
                h = layer_output(model, l - 1, prev, encoder_out, sublayer)
                out[f"dec{l}-{part}"] = classifier_input(model.decoder, h)
    return out


def probe_logits(model, probe: LayerProbe, name: str, features: Dict[str, object]) -> torch.Tensor:
    return model.decoder.output_layer(probe(features[name], features.get("attn")))


def build_probes(model, names: Sequence[str]) -> nn.ModuleDict:
    dim_out = model.decoder.output_embed_dim
    heads = sum(getattr(layer.encoder_attn, "num_heads", 0) for layer in decoder_layers(model)
                if getattr(layer, "encoder_attn", None) is not None)
    dim_enc = primary_encoder(model).embed_tokens.embedding_dim
    probes = nn.ModuleDict({name: LayerProbe(dim_enc, dim_out, alignment_size=heads) if name.startswith("enc")
                            else LayerProbe(dim_out, dim_out) for name in names})
    return probes.to(next(model.parameters()).device)


@torch.no_grad()
def evaluate_probes(model, task, split: str, probes: nn.ModuleDict, max_tokens: int = 4000,
                    max_sentences: Optional[int] = None) -> Dict[str, dict]:
    """name -> {"correct", "total", "accuracy"} over ``split``, and ``model``'s own."""
    pad = task.target_dictionary.pad()
    counts = {name: [0, 0] for name in [*probes, "model"]}
    probes.eval()
    for sample in command.batches(task, split, max_tokens, max_sentences, next(model.parameters()).device):
        feats = frozen_features(model, sample, list(probes))
        target = sample["target"]
        mask = target.ne(pad)
        for name in counts:
            logits = model.decoder.output_layer(feats["model"]) if name == "model" else \
                probe_logits(model, probes[name], name, feats)
            counts[name][0] += int((logits.argmax(-1).eq(target) & mask).sum())
            counts[name][1] += int(mask.sum())
    return {name: {"correct": c, "total": n, "accuracy": c / n if n else float("nan")}
            for name, (c, n) in counts.items()}


def train_probes(model, task, probes: nn.ModuleDict, train_split: str, valid_split: str, lr: float = 1e-3,
                 max_epoch: int = 3, max_update: Optional[int] = None, validate_interval: int = 1000,
                 max_tokens: int = 4000, max_train_sentences: Optional[int] = None,
                 max_valid_sentences: Optional[int] = None, seed: int = 1, log=sys.stderr) -> Dict[str, float]:
    """Adam on each probe's cross-entropy (the model frozen); each keeps its best validation
    parameters. Returns name -> best validation accuracy."""
    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(seed)
    pad = task.target_dictionary.pad()
    optimizer = torch.optim.Adam(probes.parameters(), lr=lr)
    best = {name: -1.0 for name in probes}
    best_state = {name: {k: v.clone() for k, v in probes[name].state_dict().items()} for name in probes}

    def validate(tag):
        scores = evaluate_probes(model, task, valid_split, probes, max_tokens, max_valid_sentences)
        for name in probes:
            if scores[name]["accuracy"] > best[name]:
                best[name] = scores[name]["accuracy"]
                best_state[name] = {k: v.clone() for k, v in probes[name].state_dict().items()}
        summary = " ".join(f"{n}={100 * scores[n]['accuracy']:.1f}" for n in probes)
        print(f"[word_translation] {tag}: valid accuracy {summary}", file=log)

    updates, start = 0, time.time()
    validate("before training")
    for epoch in range(1, max_epoch + 1):
        for sample in command.batches(task, train_split, max_tokens, max_train_sentences,
                                      next(model.parameters()).device, epoch=epoch, seed=seed):
            probes.train()
            feats = frozen_features(model, sample, list(probes))
            target = sample["target"]
            ntokens = int(target.ne(pad).sum())
            optimizer.zero_grad()
            for name, probe in probes.items():
                logits = probe_logits(model, probe, name, feats)
                loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), target.reshape(-1),
                                                   ignore_index=pad, reduction="sum") / max(ntokens, 1)
                loss.backward()
            optimizer.step()
            updates += 1
            if validate_interval and updates % validate_interval == 0:
                validate(f"epoch {epoch}, update {updates} ({time.time() - start:.0f}s)")
            if max_update and updates >= max_update:
                break
        if not (validate_interval and updates % validate_interval == 0):
            validate(f"end of epoch {epoch}, update {updates} ({time.time() - start:.0f}s)")
        if max_update and updates >= max_update:
            break
    for name in probes:
        probes[name].load_state_dict(best_state[name])
    return best


def add_training_arguments(ap):
    g = ap.add_argument_group("training the projections")
    g.add_argument("--train-split", default="train")
    g.add_argument("--valid-split", default="valid")
    g.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    g.add_argument("--max-epoch", type=int, default=3)
    g.add_argument("--max-update", type=int, help="stop after N updates")
    g.add_argument("--validate-interval", type=int, default=1000, help="validate every N updates (and every epoch)")
    g.add_argument("--max-tokens", type=int, default=4000)
    g.add_argument("--max-train-sentences", type=int, help="train on the sentences with ids below N")
    g.add_argument("--max-valid-sentences", type=int, help="validate on the sentences with ids below N")
    g.add_argument("--seed", type=int, default=1)
    return ap


def trained_probes(args, names_of) -> tuple:
    """(model, task, the probes ``names_of(model)``, trained and saved to OUT/projections.pt)."""
    model, task = checkpoints.load_model(args.checkpoint, args.data, cpu=args.cpu)
    for split in {args.train_split, args.valid_split, args.split}:
        task.load_dataset(split)
    probes = build_probes(model, names_of(model))
    train_probes(model, task, probes, args.train_split, args.valid_split, **{k: getattr(args, k) for k in (
        "lr", "max_epoch", "max_update", "validate_interval", "max_tokens", "max_train_sentences",
        "max_valid_sentences", "seed")})
    save_atomically({"checkpoint": os.path.abspath(args.checkpoint),
                     "probes": {name: {k: v.cpu() for k, v in p.state_dict().items()} for name, p in probes.items()}},
                    os.path.join(args.out, "projections.pt"))
    return model, task, probes


def load_projections(model, path: str, names: Sequence[str]) -> nn.ModuleDict:
    if not os.path.exists(path):
        raise AnalysisError(f"--projections {path}: no such file")
    state = load_checkpoint_state(path)
    missing = [n for n in names if n not in state.get("probes", {})]
    if missing:
        raise AnalysisError(f"--projections {path}: no trained projection for {', '.join(missing)}")
    probes = build_probes(model, names)
    for name in names:
        try:
            probes[name].load_state_dict(state["probes"][name])
        except RuntimeError as e:
            raise AnalysisError(f"--projections {path}: {name} does not fit this model "
                                f"({str(e).splitlines()[-1].strip()})") from None
    return probes


def table_rows(scores: Dict[str, dict], num_encoder_layers: int, num_decoder_layers: int) -> List[dict]:
    """Tables 1 / 5: per layer, accuracy (%) and its delta (of the unrounded accuracies)."""
    def acc(name):
        return 100 * scores[name]["accuracy"] if name in scores else None

    def rounded(a):
        return round(a, 2) if a is not None else None

    def delta(a, b):
        return round(a - b, 2) if a is not None and b is not None else None

    rows = []
    for l in range(max(num_encoder_layers, num_decoder_layers) + 1):
        enc, dec = acc(f"enc{l}"), acc(f"dec{l}")
        no_self, no_cross = acc(f"dec{l}-self"), acc(f"dec{l}-cross")
        rows.append({"layer": l, "encoder": rounded(enc),
                     "encoder delta": delta(enc, acc(f"enc{l - 1}")) if l else None,
                     "decoder": rounded(dec), "decoder delta": delta(dec, acc(f"dec{l - 1}")) if l else None,
                     "-self attention": rounded(no_self), "-self delta": delta(no_self, dec),
                     "-cross attention": rounded(no_cross), "-cross delta": delta(no_cross, dec)})
    return rows


def plot(rows: List[dict], model_accuracy: float, path: str, context: Optional[FigureContext] = None):
    fig, ax = pyplot().subplots(figsize=(6, 3.8))
    for key, style in (("encoder", "o-"), ("decoder", "s-"), ("-self attention", "v--"), ("-cross attention", "^--")):
        pts = [(r["layer"], r[key]) for r in rows if r[key] is not None]
        if pts:
            ax.plot(*zip(*pts), style, label=key)
    ax.axhline(100 * model_accuracy, color="gray", linestyle=":", label="model (no projection)")
    layer_axes(ax, "layer (0 = embeddings)", "word translation accuracy (%)", legend=8)
    return save_figure(fig, path, context)


def build_parser():
    ap = command.parser(__doc__, several=False, max_sentences=True)
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                    help="encoder layers, decoder layers, decoder layers without self- / cross-attention")
    return add_training_arguments(ap)


def execute(args, figures: FigureContext):
    model, task, probes = trained_probes(args, lambda model: probe_names(
        len(primary_encoder(model).layers), len(decoder_layers(model)), args.parts))
    num_enc, num_dec = len(primary_encoder(model).layers), len(decoder_layers(model))
    scores = evaluate_probes(model, task, args.split, probes, args.max_tokens, args.max_sentences)
    rows = table_rows(scores, num_enc, num_dec)
    command.write_table(rows, args.out, "word_translation", f"Word translation accuracy (%) on {args.split}")
    last = f"dec{num_dec}"  # Table 3: the last decoder layer through its projection vs the model itself
    command.write_table([{"approach": f"analysis of decoder layer {num_dec}",
                          "accuracy": round(100 * scores[last]["accuracy"], 2) if last in scores else None},
                         {"approach": "the model (no projection)",
                          "accuracy": round(100 * scores["model"]["accuracy"], 2)}],
                        args.out, "last_layer", "The last decoder layer through the projection vs the model")
    plot(rows, scores["model"]["accuracy"], os.path.join(args.out, "word_translation.png"), figures)
    written = "word_translation.{md,csv,json,png}, last_layer.*, projections.pt"
    print(f"written: {args.out}/{written} ({scores['model']['total']} target tokens)")


main = command.main(build_parser, execute)

if __name__ == "__main__":
    sys.exit(main())
