"""``--bf16`` trains on the GPU (and the CPU) instead of failing for want of a TPU.

fairseq 0.12's ``options.parse_args_and_arch`` turns every ``--bf16`` into ``--tpu``
(``--bf16``'s help: "use bfloat16; implies --tpu"), so ``fairseq-train --bf16`` on a GPU
starts fairseq's XLA path and dies importing ``torch_xla``. Its trainer and optimizer handle
bf16 on any device without that flag: the model and every batch in bf16, ``FP16Optimizer``
with fp32 master weights and no loss scaler (``fairseq-hydra-train common.bf16=true`` takes
that path already, since only the argparse path sets ``tpu``).

This guard wraps the namespace-to-config conversion that the argparse commands go through
(``convert_namespace_to_omegaconf``, and ``fairseq_cli.train``'s, which it imported by name
before the plugin loaded) and clears the ``tpu`` that ``--bf16`` implied when TPU training
cannot be what the user meant: no ``--tpu`` on the command line and no ``torch_xla`` to run
it. With ``torch_xla`` installed, or ``--tpu`` given, fairseq's behaviour is unchanged."""
import importlib.util
import sys
from typing import Sequence

from fairseq_ext.guards.patching import replace


def implied_tpu_only(args, argv: Sequence[str]) -> bool:
    """Whether ``args.tpu`` comes from ``--bf16`` alone, on a machine that cannot run XLA."""
    return (bool(getattr(args, "bf16", False)) and bool(getattr(args, "tpu", False))
            and "--tpu" not in argv and importlib.util.find_spec("torch_xla") is None)


def _keeping_device(original):
    def convert_namespace_to_omegaconf(args):
        if implied_tpu_only(args, sys.argv):
            args.tpu = False
        return original(args)

    return convert_namespace_to_omegaconf


def install() -> None:
    from fairseq.dataclass import utils

    replace(utils, "convert_namespace_to_omegaconf", _keeping_device)
    # training is where ``tpu`` matters (fairseq's generation and validation go by --cpu and CUDA)
    module = sys.modules.get("fairseq_cli.train")
    if module is not None and hasattr(module, "convert_namespace_to_omegaconf"):
        replace(module, "convert_namespace_to_omegaconf", _keeping_device)
