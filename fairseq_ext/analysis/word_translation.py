"""Word-translation accuracy of every encoder and decoder layer (Xu et al. 2020, "Analyzing
Word Translation of Transformer Layers", Sec. 2-3, Tables 1, 3 and 5).

The trained model is frozen. For each analysed layer a d x d linear projection without
bias (initialised to the identity) is trained to map the layer's output into the model's own
classifier (``decoder.output_layer``: the tied output embedding, after the model's
pre-classifier projection if it has one); the only trained parameters are the projections and
the alignment weights w. Layers are analysed independently (each has its own projection
and w; they are trained side by side on the same batches, which is the same as training them
one after another since no parameter is shared).

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

Accuracy: the argmax of the classifier over the whole vocabulary equals y_t, counted over
every target token of the split including the end-of-sentence token (padding excluded).
The projections (and w) are trained with cross-entropy on ``--train-split``; after every
``--validate-interval`` updates and every epoch each probe's accuracy on ``--valid-split``
is measured and its best parameters kept (early stopping per probe); the table reports
``--split``. Delta is the gain over the layer below (Table 1's "Delta"); for the bypassed
sublayers it is the loss against the same layer computed in full.

    python -m fairseq_ext.analysis.word_translation --checkpoint base/checkpoint_best.pt \\
        --data data-bin/wmt14.en-de --split test --out analysis/wt [--max-train-sentences 200000]

Writes word_translation.{md,csv,json} (Table 1 / 5 layout), last_layer.{md,csv,json}
(Table 3: the last decoder layer through the projection vs the model's own teacher-forced
accuracy), word_translation.png (accuracy per layer: encoder, decoder, -self, -cross) and
projections.pt (every trained projection and w; ``translate_from_layer --projections``
reads it).
"""
import os
import sys
from typing import Dict, List, Optional

from fairseq_ext.analysis import command
from fairseq_ext.analysis.encoder_features import primary_encoder
from fairseq_ext.analysis.figures import FigureContext, layer_axes, pyplot, save_figure
from fairseq_ext.analysis.registry import Analysis
from fairseq_ext.analysis.table_files import write_table
from fairseq_ext.analysis.translation_probe_training import (add_training_arguments, evaluate_probes,
                                                             load_for_training, save_projections, train_from_args)
from fairseq_ext.analysis.translation_probes import PARTS, decoder_layers, probe_names

ANALYSIS = Analysis("word_translation", "Word-translation accuracy per layer",
                    "Xu et al. 2020, Sec. 2-3, Tables 1, 3, 5", single=True, order=80)


def table_rows(scores: Dict[str, dict], num_encoder_layers: int, num_decoder_layers: int) -> List[dict]:
    """Tables 1 / 5: per layer, accuracy (%) and its delta."""
    def acc(name):
        return 100 * scores[name]["accuracy"] if name in scores else None

    def rounded(a):
        return round(a, 2) if a is not None else None

    def delta(a, b):  # of the unrounded accuracies
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


def last_layer_rows(scores: Dict[str, dict], num_decoder_layers: int) -> List[dict]:
    """Table 3: the last decoder layer through its projection vs the model itself."""
    last = f"dec{num_decoder_layers}"
    return [{"approach": f"analysis of decoder layer {num_decoder_layers}",
             "accuracy": round(100 * scores[last]["accuracy"], 2) if last in scores else None},
            {"approach": "the model (no projection)", "accuracy": round(100 * scores["model"]["accuracy"], 2)}]


def plot(rows: List[dict], model_accuracy: float, path: str, context: Optional[FigureContext] = None):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for key, style in (("encoder", "o-"), ("decoder", "s-"), ("-self attention", "v--"), ("-cross attention", "^--")):
        pts = [(r["layer"], r[key]) for r in rows if r[key] is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=key)
    ax.axhline(100 * model_accuracy, color="gray", linestyle=":", label="model (no projection)")
    layer_axes(ax, "layer (0 = embeddings)", "word translation accuracy (%)", legend=8)
    save_figure(fig, path, context)
    return fig


def build_parser():
    """This command's options (the report reads them to give it only what it takes)."""
    ap = command.parser(__doc__, several=False, max_sentences=True)
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS),
                    help="encoder layers, decoder layers, decoder layers without self- / cross-attention")
    add_training_arguments(ap)
    return ap


def execute(args, figures: FigureContext):
    model, task = load_for_training(args)
    num_enc, num_dec = len(primary_encoder(model).layers), len(decoder_layers(model))
    names = probe_names(num_enc, num_dec, args.parts)
    probes = train_from_args(model, task, names, args)
    save_projections(probes, os.path.join(args.out, "projections.pt"), args.checkpoint)
    scores = evaluate_probes(model, task, args.split, probes, args.max_tokens, args.max_sentences)
    rows = table_rows(scores, num_enc, num_dec)
    write_table(rows, args.out, "word_translation", f"Word translation accuracy (%) on {args.split}")
    write_table(last_layer_rows(scores, num_dec), args.out, "last_layer",
                "The last decoder layer through the projection vs the model")
    plot(rows, scores["model"]["accuracy"], os.path.join(args.out, "word_translation.png"), figures)
    written = "word_translation.{md,csv,json,png}, last_layer.*, projections.pt"
    print(f"written: {args.out}/{written} ({scores['model']['total']} target tokens)")


def main(argv=None):
    return command.run(build_parser, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
