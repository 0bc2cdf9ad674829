"""The multi-output loss (fairseq_ext/criterions/multi_output_label_smoothed_cross_entropy.py,
thesis Eq. 4.1): the main decoder's label-smoothed cross-entropy plus gamma times each
auxiliary decoder's, against a hand computation; without auxiliary decoders it is fairseq's
label_smoothed_cross_entropy; an auxiliary loss trains only the encoder layers below its
decoder; the metrics fairseq-train logs are exact in base 2."""
import math
from types import SimpleNamespace

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    label_smoothed_nll_loss,
)

from fairseq_ext.criterions.multi_output_label_smoothed_cross_entropy import (
    MultiOutputLabelSmoothedCrossEntropyCriterion,
)
from model_utils import SMALL, build, make_dictionary, random_batch


def sample_for(dictionary, seed=1):
    src, lengths, prev = random_batch(dictionary, seed=seed)
    target = torch.cat([prev[:, 1:], torch.full((prev.size(0), 1), dictionary.eos())], dim=1)
    target[0, -2:] = dictionary.pad()  # a padded target
    net_input = {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}
    return {"net_input": net_input, "target": target, "ntokens": int(target.ne(dictionary.pad()).sum())}


def criterion_for(dictionary, cls=MultiOutputLabelSmoothedCrossEntropyCriterion, **kwargs):
    task = SimpleNamespace(target_dictionary=dictionary)
    return cls(task, sentence_avg=False, label_smoothing=0.1, **kwargs)


@pytest.mark.parametrize("gamma", [1.0, 0.3])
def test_loss_equals_hand_computation(gamma):
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1,2", dictionary=dictionary)
    sample = sample_for(dictionary)
    criterion = criterion_for(dictionary, aux_loss_weight=gamma)
    loss, sample_size, logs = criterion(model, sample)
    with torch.no_grad():
        logits, extra = model(**sample["net_input"])
    target = sample["target"].view(-1)
    terms = []
    for out in [logits] + extra["aux_out"]:
        lprobs = torch.log_softmax(out.float(), dim=-1).view(-1, out.size(-1))
        terms.append(label_smoothed_nll_loss(lprobs, target, 0.1, ignore_index=dictionary.pad())[0])
    assert torch.allclose(loss, terms[0] + gamma * (terms[1] + terms[2]), atol=1e-4)
    assert torch.allclose(logs["main_loss"], terms[0], atol=1e-4)
    assert torch.allclose(logs["aux1_loss"], terms[1], atol=1e-4)
    assert torch.allclose(logs["aux2_loss"], terms[2], atol=1e-4)
    assert sample_size == sample["ntokens"]


def test_without_aux_decoders_the_criterion_is_label_smoothed_cross_entropy():
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, dictionary=dictionary)
    sample = sample_for(dictionary)
    ours = criterion_for(dictionary)(model, sample)
    stock = criterion_for(dictionary, cls=LabelSmoothedCrossEntropyCriterion)(model, sample)
    assert torch.equal(ours[0], stock[0])
    assert ours[1] == stock[1]
    assert torch.equal(ours[2]["nll_loss"], stock[2]["nll_loss"])


def test_aux_loss_gradients_reach_only_the_encoder_layers_below():
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1", dictionary=dictionary)
    model.train()
    sample = sample_for(dictionary)
    _, extra = model(**sample["net_input"])
    aux_logits = extra["aux_out"][0]
    lprobs = torch.log_softmax(aux_logits, dim=-1).view(-1, aux_logits.size(-1))
    label_smoothed_nll_loss(lprobs, sample["target"].view(-1), 0.1, ignore_index=dictionary.pad())[0].backward()

    def grad_norm(module):
        return sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)

    assert grad_norm(model.encoder.layers[0]) > 0  # layer 1 feeds the aux decoder
    assert grad_norm(model.encoder.layers[1]) == 0 and grad_norm(model.encoder.layers[2]) == 0
    assert grad_norm(model.decoder.aux_decoders[0].layers) > 0
    assert grad_norm(model.decoder.layers) == 0  # the main decoder's layers are untouched


def _reduced(criterion_cls, logging_outputs):
    from fairseq.logging import metrics
    with metrics.aggregate() as agg:
        criterion_cls.reduce_metrics(logging_outputs)
        return {k: float(v) for k, v in agg.get_smoothed_values().items()}


def test_logged_metrics_are_exact_in_base_2():
    """What fairseq-train prints: every term summed over the batches in nats, divided by its
    denominator (sample_size for losses, ntokens for nll losses) and by ln 2; with no
    auxiliary decoder, loss / nll_loss / main_loss equal label_smoothed_cross_entropy's."""
    dictionary = make_dictionary()
    model, _ = build("multilayer_transformer", *SMALL, "--aux-decoder-layers", "1", dictionary=dictionary)
    criterion = criterion_for(dictionary, aux_loss_weight=0.5)
    logs = [criterion(model, sample_for(dictionary, seed=s))[2] for s in (1, 2)]
    reduced = _reduced(type(criterion), logs)
    sample_size = sum(log["sample_size"] for log in logs)
    ntokens = sum(log["ntokens"] for log in logs)
    for key, denominator in (("main_loss", sample_size), ("aux1_loss", sample_size), ("aux1_nll_loss", ntokens),
                             ("loss", sample_size)):
        expected = sum(float(log[key]) for log in logs) / denominator / math.log(2)
        assert abs(reduced[key] - expected) < 1e-3, (key, reduced[key], expected)
    main = sum(float(log["main_loss"]) for log in logs)
    aux = sum(float(log["aux1_loss"]) for log in logs)
    assert abs(reduced["loss"] - (main + 0.5 * aux) / sample_size / math.log(2)) < 1e-3

    plain, _ = build("multilayer_transformer", *SMALL, dictionary=dictionary)
    ours = [criterion_for(dictionary)(plain, sample_for(dictionary, seed=s))[2] for s in (1, 2)]
    stock = [criterion_for(dictionary, cls=LabelSmoothedCrossEntropyCriterion)(plain, sample_for(dictionary, seed=s))[2]
             for s in (1, 2)]
    ours_reduced = _reduced(type(criterion), ours)
    stock_reduced = _reduced(LabelSmoothedCrossEntropyCriterion, stock)
    for key in ("loss", "nll_loss", "ppl"):
        assert abs(ours_reduced[key] - stock_reduced[key]) < 1e-6, key
    assert abs(ours_reduced["main_loss"] - stock_reduced["loss"]) < 1e-3
