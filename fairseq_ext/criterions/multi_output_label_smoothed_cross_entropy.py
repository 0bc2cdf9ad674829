"""Multi-output loss of Encoder-based Multi-level Supervision (thesis Eq. 4.1):

    J = L_main + gamma * sum_l L_aux_l

each term a label-smoothed cross entropy against the same targets. The auxiliary decoders'
logits come from the model in ``net_output[1]["aux_out"]``. Every term is logged
separately (``main_loss``, ``aux<l>_loss``, ``aux<l>_nll_loss``); with no auxiliary decoder
the criterion is exactly fairseq's ``label_smoothed_cross_entropy``.
"""
from dataclasses import dataclass, field

import torch
from fairseq import utils
from fairseq.logging import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from fairseq_ext import keys


@dataclass
class MultiOutputLabelSmoothedCrossEntropyCriterionConfig(LabelSmoothedCrossEntropyCriterionConfig):
    aux_loss_weight: float = field(
        default=1.0, metadata={"help": "gamma: weight of the sum of the auxiliary decoders' losses (Eq. 4.1)"}
    )


@register_criterion(
    "multi_output_label_smoothed_cross_entropy",
    dataclass=MultiOutputLabelSmoothedCrossEntropyCriterionConfig,
)
class MultiOutputLabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 aux_loss_weight=1.0):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        self.aux_loss_weight = aux_loss_weight

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "main_loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        aux_layers = getattr(model.decoder, "aux_layers", [])
        for layer, aux_logits in zip(aux_layers, net_output[1].get(keys.AUX_OUT) or []):
            aux_loss, aux_nll = self.compute_loss(model, (aux_logits, net_output[1]), sample, reduce=reduce)
            loss = loss + self.aux_loss_weight * aux_loss
            logging_output[f"aux{layer}_loss"] = aux_loss.data
            logging_output[f"aux{layer}_nll_loss"] = aux_nll.data
        logging_output["loss"] = loss.data
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        keys = sorted({k for log in logging_outputs for k in log if k.endswith("_loss") and k not in ("loss", "nll_loss")})
        for key in keys:
            total = sum(log.get(key, 0) for log in logging_outputs)
            # losses are summed in nats; reported in base 2 like fairseq's loss / nll_loss
            denominator = ntokens if key.endswith("nll_loss") else sample_size
            metrics.log_scalar(key, total / denominator / torch.log(torch.tensor(2.0)).item(), denominator, round=3)
