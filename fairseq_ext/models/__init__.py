from fairseq_ext.models import multilayer_transformer  # noqa: F401  (registers the model and presets)
