"""``fairseq-ext selfcheck`` (:mod:`.main`), ``selfcheck-pack`` (:mod:`.pack`) and ``benchmark``
(:mod:`.benchmark`, :mod:`.updates`, :mod:`.timing`): does the plugin work here, at what cost?"""
