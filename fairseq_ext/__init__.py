"""fairseq_ext: multi-layer Transformer architectures for NMT, as a fairseq user dir.

Importing this package (``--user-dir fairseq_ext``) registers the model, its presets and
the criterion, and allowlists the types fairseq checkpoints hold so that torch's
``weights_only=True`` loading works for stock fairseq-generate.
"""
from fairseq_ext import checkpoint_safety  # noqa: F401  (installs the allowlist)
from fairseq_ext import models  # noqa: F401
from fairseq_ext import criterions  # noqa: F401
from fairseq_ext import tasks  # noqa: F401
