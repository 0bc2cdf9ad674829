"""fairseq_ext: multi-layer Transformer architectures for NMT, as a fairseq user dir.

Importing this package (``--user-dir fairseq_ext``) installs the plugin's guards on fairseq 0.12
(docs/trust.md), then registers the models, their presets, the criterion and the task. It also
silences the deprecation warnings that fairseq 0.12's own code draws from hydra and torch at every
start (none a user can act on); every other warning is shown as before.
"""
import warnings

from fairseq_ext import guards

# (message start, category) of what fairseq 0.12's own calls into hydra and torch warn
FAIRSEQ_DEPRECATIONS = (
    (r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental", UserWarning),
    (r"\s*The version_base parameter is not specified", UserWarning),
    (r"In 'config': Usage of deprecated keyword in package header", UserWarning),
    (r"\s*'config' is validated against ConfigStore schema with the same name", UserWarning),
    (r"\s*The strict flag in the compose API is deprecated", UserWarning),
    (r"Support for mismatched key_padding_mask and attn_mask is deprecated", UserWarning),
    (r"'pin_memory' argument is set as true but no accelerator is found", UserWarning),
    (r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", FutureWarning),
)
for _message, _category in FAIRSEQ_DEPRECATIONS:
    warnings.filterwarnings("ignore", message=_message, category=_category)

guards.install()  # before anything registers or loads: every checkpoint load is checked

from fairseq_ext import models  # noqa: E402,F401
from fairseq_ext import criterions  # noqa: E402,F401
from fairseq_ext import tasks  # noqa: E402,F401
