"""``--bf16`` trains on the GPU (and the CPU) instead of failing for want of a TPU (docs/trust.md).

fairseq 0.12's ``options.parse_args_and_arch`` turns every ``--bf16`` into ``--tpu``, although its trainer and
``FP16Optimizer`` handle bf16 on any device. This guard wraps the namespace-to-config conversion of the argparse
commands (``convert_namespace_to_omegaconf``, also as ``fairseq_cli.train`` imported it) and clears that ``tpu`` when no
``--tpu`` was given and no ``torch_xla`` can run it."""
import importlib.util
import sys

from fairseq_ext.guards.patching import replace


def _keeping_device(original):
    def convert_namespace_to_omegaconf(args):
        # ``tpu`` from ``--bf16`` alone, on a machine that cannot run XLA
        if (getattr(args, "bf16", False) and getattr(args, "tpu", False) and "--tpu" not in sys.argv
                and importlib.util.find_spec("torch_xla") is None):
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
