"""fairseq_ext: multi-layer Transformer architectures for NMT as a fairseq plugin."""
from setuptools import find_packages, setup

setup(
    name="fairseq_ext",
    version="0.1.0",
    description=(
        "Joint attention over encoder layers, multi-level supervision, dual contextual "
        "and mixed multi-head self-attention for fairseq"
    ),
    packages=find_packages(include=["fairseq_ext", "fairseq_ext.*"]),
    # the bash recipes and the configs ship with the package (fairseq-ext prepare/train/
    # evaluate/reproduce read them from there, wherever it is installed)
    package_data={"fairseq_ext": ["recipes/*.sh", "recipes/lib/*.sh", "configs/*.args",
                                  "configs/tables/*.yaml", "configs/benchmarks/*.yaml"]},
    python_requires=">=3.9",
    # fairseq itself is installed separately (see Makefile): the PyPI build for
    # Python 3.11 is `fairseq-fixed`, installed --no-deps so it cannot pull another torch.
    install_requires=[
        "torch>=1.13",
        "sacrebleu>=2.0",
        "sentencepiece",
        "subword-nmt",
        "sacremoses",
        "compare-mt",
        "pyyaml",
        "matplotlib",
        # fairseq's --tensorboard-logdir writes through it, and fairseq logs "Please install
        # tensorboardX" first in every command without it; 2.6.2 on takes any protobuf >= 3.20
        # (2.6 and older pin protobuf below 4)
        "tensorboardX>=2.6.2",
        # METEOR (fairseq_ext/tools/meteor.py); the Makefile pins the version the docs measured
        "nltk>=3.10.4",
    ],
    extras_require={"test": ["pytest", "pytest-xdist>=3.8"]},
    entry_points={
        "console_scripts": [
            "fairseq-ext=fairseq_ext.cli:main",
            "fairseq-ext-strip-aux=fairseq_ext.strip_aux:cli_main",
            "fairseq-ext-average-checkpoints=fairseq_ext.average_checkpoints:cli_main",
        ]
    },
)
