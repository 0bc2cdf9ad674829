"""``multilayer_transformer``: one composable Transformer for the multi-layer NMT
architectures of Ampomah's thesis and papers (docs/design.md).

Composable parts, every one off by default (then the model is fairseq's ``transformer``):
- how the decoder reads the encoder layers (``--joint-attention``): layer aggregation,
  transparent attention, MLMHA (M-00/01/10/11), multi-source combination;
- auxiliary decoders on lower encoder layers (``--aux-decoder-layers``), with optional
  Auxiliary Information Fusion (``--aux-fusion``);
- the encoder / decoder self-attention (``--encoder-self-attention``,
  ``--decoder-self-attention``): standard, Dual Contextual (DC) or Mixed Multi-Head (MMA);
- a pre-classifier projection (``--pre-classifier-projection``).

Where the code lives (one concern per file):
- ``multilayer_transformer_config.py``: the options (help and default once) and their
  typed form, parsed and checked once at build;
- ``joint_attention_strategies.py``: the table of joint attention strategies;
- ``multilayer_transformer_encoder.py`` / ``multi_source_encoder.py``: the encoders;
- ``multilayer_transformer_decoder.py``: the decoder and its layers;
- this file: the model; ``multilayer_transformer_legacy.py``: the ``--arch`` presets;
- ``fairseq_ext/modules/``: the math of each technique.
"""
import contextlib
import logging
from contextvars import ContextVar
from typing import Optional

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel
from omegaconf import OmegaConf, open_dict
from torch import Tensor

from fairseq_ext.criterions.multi_output_label_smoothed_cross_entropy import (
    MultiOutputLabelSmoothedCrossEntropyCriterion,
)
from fairseq_ext import keys
from fairseq_ext.errors import CheckpointError, OptionError
from fairseq_ext.models.multi_source_encoder import MultiSourceEncoder
from fairseq_ext.models.multilayer_transformer_config import (
    MultilayerOptions,
    add_options,
    apply_defaults,
    parse_options,
)
from fairseq_ext.models.multilayer_transformer_decoder import MultilayerTransformerDecoder
from fairseq_ext.models.multilayer_transformer_encoder import MultilayerTransformerEncoder
from fairseq_ext.models.warm_start import WARM_START, warm_start_state

logger = logging.getLogger(__name__)

# the parsed options of the model being built, for build_encoder / build_decoder (fairseq
# hands them a TransformerConfig made from args, a Namespace or, under fairseq-hydra-train, the
# model's DictConfig, which can hold neither the options' callables nor an unknown key);
# never saved in a checkpoint
_BUILDING: ContextVar[Optional[MultilayerOptions]] = ContextVar("multilayer_options", default=None)


@register_model("multilayer_transformer")
class MultilayerTransformerModel(TransformerModel):
    """fairseq's Transformer with the multi-layer architectures of Ampomah's thesis as
    options; with every option off it is numerically the stock ``transformer``."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_options(parser)

    @classmethod
    def build_model(cls, args, task):
        # args: fairseq-train's Namespace, or fairseq-hydra-train's model DictConfig (the
        # defaults are written into it, so that its checkpoint holds every option)
        with open_dict(args) if OmegaConf.is_config(args) else contextlib.nullcontext():
            apply_defaults(args)
            # multi-source translation: the n sources of the combination are the task's sentences
            args.num_source_sentences = getattr(task, "num_source_sentences", 1)
        token = _BUILDING.set(parse_options(args, args.num_source_sentences))
        try:
            return super().build_model(args, task)
        finally:
            _BUILDING.reset(token)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """fairseq's load; in a warm start (``--finetune-from-model``, or ``--restore-file``
        with ``--reset-optimizer``) the checkpoint may be of the stock model or of other options
        of the same sizes: :func:`~fairseq_ext.models.warm_start.warm_start_state`."""
        checkpoint = WARM_START.get()
        if checkpoint is not None:
            self.upgrade_state_dict(state_dict)
            try:
                state_dict, summary = warm_start_state(self, state_dict)
            except CheckpointError as error:
                raise CheckpointError(f"warm start from {checkpoint}: {error}") from None
            logger.info(f"warm start from {checkpoint}: {summary}")
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer: Optional[int] = None,
                alignment_heads: Optional[int] = None, extra_src_tokens: Optional[Tensor] = None):
        """fairseq's forward, plus the extra sources of multi-source translation."""
        extra = {} if extra_src_tokens is None else {keys.EXTRA_SRC_TOKENS: extra_src_tokens}
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens, **extra)
        return self.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
                            alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                            src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)

    def check_training_setup(self, criterion, cfg) -> None:
        """Called when fairseq-train starts (fairseq_ext/guards/training_checks.py): auxiliary
        decoders are trained only by the multi-output loss; with any other criterion they
        would run every step, get no gradient and log nothing."""
        aux_layers = getattr(self.decoder, "aux_layers", [])
        if aux_layers and not isinstance(criterion, MultiOutputLabelSmoothedCrossEntropyCriterion):
            name = getattr(cfg.criterion, "_name", None) or type(criterion).__name__
            raise OptionError(
                f"--aux-decoder-layers {','.join(map(str, aux_layers))} needs --criterion "
                f"multi_output_label_smoothed_cross_entropy: with --criterion {name} the auxiliary decoders "
                f"would get no loss"
            )
        if aux_layers and cfg.checkpoint.best_checkpoint_metric == "loss":
            logger.warning("multi-level supervision: --best-checkpoint-metric loss includes the auxiliary losses; "
                           "--best-checkpoint-metric main_loss selects checkpoints by the main decoder's loss")

    @staticmethod
    def options_of(cfg) -> MultilayerOptions:
        """The options of the model :meth:`build_model` is building (``cfg``: its
        TransformerConfig, which does not carry them)."""
        options = _BUILDING.get()
        if options is None:
            raise RuntimeError("MultilayerTransformerModel's encoder and decoder are built by its build_model")
        return options

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        options = cls.options_of(cfg)
        if options.num_source_sentences > 1:
            num_encoders = 1 if options.shared_source_encoder else options.num_source_sentences
            return MultiSourceEncoder(
                [MultilayerTransformerEncoder(cfg, options, src_dict, embed_tokens, joint_memory=False)
                 for _ in range(num_encoders)], options.num_source_sentences,
            )
        return MultilayerTransformerEncoder(cfg, options, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return MultilayerTransformerDecoder(cfg, cls.options_of(cfg), tgt_dict, embed_tokens,
                                            no_encoder_attn=cfg.no_cross_attention)
