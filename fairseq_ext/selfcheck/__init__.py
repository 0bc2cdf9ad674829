"""``fairseq-ext selfcheck``: does the plugin work on this machine's device, in fp32, fp16 and
bf16, and what does each technique cost here? In stages, each one command that fits in a few
minutes and writes ``STAGE.json`` and ``STAGE.md`` into the output folder:

- ``env`` (:mod:`.environment`): the device, driver, torch, CUDA, cuDNN, fairseq and packages;
- ``tests`` (:mod:`.stages`): the test suite's model tests on the device (``pytest --device``);
- ``bench`` (:mod:`.stages`): :mod:`.benchmark` in fp16 and bf16 against the stock
  Transformer, beside the thesis' overheads;
- ``train`` (:mod:`.training`): the quickstart model on Multi30k, baseline and M-10, then
  IWSLT'15 En-Vi at the small config, resumable across commands.

``fairseq-ext selfcheck-pack`` (:mod:`.pack`) gathers what the check needs on a machine
without a package registry: the wheels its Python lacks and the binarized data.
"""
