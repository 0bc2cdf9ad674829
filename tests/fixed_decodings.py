"""A stand-in for ``fairseq_ext.analysis.decoding.evaluate`` that decodes nothing: each
checkpoint's "translation" is a fixed list of lines, scored by sacreBLEU in one flavour, so
that an analysis' table can be checked against numbers sacreBLEU gives directly."""
import os


def fixed_decodings(outputs, refs, flavour):
    """evaluate(checkpoint, data, split, out, ...) writing ``refs`` and ``outputs[checkpoint]``
    where evaluate.sh would (``ref.detok``, ``hyp.detok`` in ``out``) and reporting their BLEU
    in ``flavour`` as the headline."""
    from fairseq_ext.tools.statistics import bleu_metric

    def evaluate(checkpoint, data, split, out, overrides=None, generate_args=(), cpu=False, src=None, tgt=None):
        os.makedirs(out, exist_ok=True)
        for name, lines in (("ref.detok", refs), ("hyp.detok", outputs[checkpoint])):
            with open(os.path.join(out, name), "w") as f:
                f.write("\n".join(lines) + "\n")
        score = bleu_metric(flavour).corpus_score(outputs[checkpoint], [refs]).score
        return {"dir": out, "bleu": {flavour: score}, "headline": flavour}
    return evaluate
