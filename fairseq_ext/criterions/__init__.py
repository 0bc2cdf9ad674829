import fairseq  # noqa: F401  (first: the plugin registers before any module here runs)
from fairseq_ext.criterions import multi_output_label_smoothed_cross_entropy  # noqa: F401
