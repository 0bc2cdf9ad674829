from fairseq_ext.tasks import multi_source_translation  # noqa: F401  (registers the task)
