"""The tools around the models: text reading and Moses/BPE helpers (``corpus``, ``spm``),
sacreBLEU in the papers' flavours (``bleu``), significance (``significance``, ``compare``, and the
compare-mt shim), every statistical test and the papers' marks (``statistics``), METEOR
(``meteor``), translating and scoring raw text (``translate``, ``score``), the CPU thread
default of training (``cpu``). ``corpus``, ``bleu``, ``spm``, ``outputs`` and ``cpu`` also run as plain files from the bash recipes, without importing the package (which would
load fairseq and torch for every call)."""
