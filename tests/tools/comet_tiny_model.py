"""A tiny COMET model, made locally, saved the way COMET saves one: run by the Python of the
COMET environment (make comet-env), not by the test suite's.

    COMET_PYTHON tests/tools/comet_tiny_model.py OUT_DIR TEXT_FILE

OUT_DIR/encoder: an XLM-R configuration of 2 layers of width 32 (random weights) with a
sentencepiece vocabulary of 200 pieces learnt from TEXT_FILE, as Hugging Face saves an encoder;
OUT_DIR/checkpoints/model.ckpt and OUT_DIR/hparams.yaml: a COMET regression metric on that
encoder (a Lightning checkpoint: state dict and hyper-parameters), as COMET's downloads hold
them. COMET's own loading (comet.load_from_checkpoint) reads it with no model hub."""
import os
import sys

import pytorch_lightning as pl
import sentencepiece as spm
import torch
import yaml
from comet.models import RegressionMetric
from transformers import XLMRobertaConfig, XLMRobertaTokenizer, XLMRobertaTokenizerFast


def main(out, text):
    encoder = os.path.join(out, "encoder")
    os.makedirs(encoder, exist_ok=True)
    prefix = os.path.join(encoder, "sentencepiece.bpe")
    spm.SentencePieceTrainer.train(input=text, model_prefix=prefix, vocab_size=200, model_type="unigram",
                                   character_coverage=1.0, bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1,
                                   minloglevel=2)
    slow = XLMRobertaTokenizer(vocab_file=prefix + ".model")
    XLMRobertaTokenizerFast(__slow_tokenizer=slow, vocab_file=prefix + ".model").save_pretrained(encoder)
    XLMRobertaConfig(vocab_size=len(slow), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=258, type_vocab_size=1,
                     pad_token_id=1).save_pretrained(encoder)
    torch.manual_seed(0)
    model = RegressionMetric(pretrained_model=encoder, encoder_model="XLM-RoBERTa", load_pretrained_weights=False,
                             hidden_sizes=[16], layer="mix", pool="avg", layer_transformation="softmax")
    os.makedirs(os.path.join(out, "checkpoints"), exist_ok=True)
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                "pytorch-lightning_version": pl.__version__}, os.path.join(out, "checkpoints", "model.ckpt"))
    with open(os.path.join(out, "hparams.yaml"), "w", encoding="utf-8") as f:
        yaml.safe_dump({"class_identifier": "regression_metric", **dict(model.hparams)}, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
