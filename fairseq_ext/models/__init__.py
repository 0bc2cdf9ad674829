import fairseq  # noqa: F401  (first: the plugin registers before any module here runs)
from fairseq_ext.models import multilayer_transformer  # noqa: F401  (registers the model)
from fairseq_ext.models import multilayer_transformer_legacy  # noqa: F401  (registers the --arch presets)
