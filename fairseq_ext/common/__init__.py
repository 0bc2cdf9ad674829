"""The shared layer under the package's commands (``tools/``) and analyses (``analysis/``): checkpoints
(:mod:`.checkpoints`) and the data directory's text contract (:mod:`.data_text`). It builds on the research core
(models, guards) and on the torch-free ground floor (standalone), and imports nothing above it."""
