"""The package's commands: evaluate, translate, score, significance (``compare``, and ``significance`` for several
systems), every statistical test (``statistics``), METEOR (``meteor``), COMET (``comet``) and the hydra configs
(``hydra_configs``). The plain-file helpers the bash recipes run are in ``fairseq_ext.standalone``."""
