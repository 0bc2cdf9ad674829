"""fairseq_ext: multi-layer Transformer architectures for NMT, as a fairseq user dir.

Importing this package (``--user-dir fairseq_ext``) registers the model, its presets and
the criterion, and installs the plugin's guards on fairseq 0.12 (see README, "Trust"):
- ``checkpoint_safety``: torch ``weights_only=True`` allowlist for the types fairseq
  checkpoints hold, and a strict literal grammar for every config field fairseq would
  ``eval()``, checked on every checkpoint load;
- ``batching``: no sentence dropped by ``batch_by_size`` (fairseq issue 5036);
- ``resume``: multi-process resume and crash-safe checkpoint resumption;
- ``errors``: option errors of the plugin print as one line, not a traceback;
- ``training_checks``: checks of the model against the criterion when training starts.
"""
from fairseq_ext import checkpoint_safety  # noqa: F401  (installs the allowlist and config checks)
from fairseq_ext import batching  # noqa: F401  (keeps every sentence)
from fairseq_ext import resume  # noqa: F401  (resume guards)
from fairseq_ext import errors  # noqa: F401  (one-line option errors)
from fairseq_ext import training_checks  # noqa: F401  (model vs criterion at fairseq-train start)
from fairseq_ext import models  # noqa: F401
from fairseq_ext import criterions  # noqa: F401
from fairseq_ext import tasks  # noqa: F401
