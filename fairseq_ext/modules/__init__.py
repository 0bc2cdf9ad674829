import fairseq  # noqa: F401  (first: the plugin registers before any module here runs)
