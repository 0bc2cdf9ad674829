import fairseq  # noqa: F401  (first: the plugin registers before any module here runs)
from fairseq_ext.tasks import multi_source_translation  # noqa: F401  (registers the task)
