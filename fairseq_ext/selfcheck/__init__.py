"""``fairseq-ext selfcheck`` (:mod:`.main`): does the plugin work on this machine's device, in
fp32, fp16 and bf16, and what does each technique cost here? Its stages: :mod:`.stages` (env,
tests, bench), :mod:`.training` (train, paper), the files they write in :mod:`.stage_files`.
``fairseq-ext selfcheck-pack`` (:mod:`.pack`) gathers what the check needs on a machine without
a package registry; ``fairseq-ext benchmark`` (:mod:`.benchmark`, :mod:`.updates`,
:mod:`.timing`) measures what each technique costs."""
