"""fairseq_ext: multi-layer Transformer architectures for NMT, as a fairseq user dir.

Importing this package (``--user-dir fairseq_ext``) installs the plugin's guards on fairseq
0.12 (:mod:`fairseq_ext.guards`: checkpoint safety, batching, resume, one-line errors,
training checks; see docs/trust.md), then registers the models, their presets, the
criterion and the task.
"""
from fairseq_ext import guards

guards.install()  # before anything registers or loads: every checkpoint load is checked

from fairseq_ext import models  # noqa: E402,F401
from fairseq_ext import criterions  # noqa: E402,F401
from fairseq_ext import tasks  # noqa: E402,F401
