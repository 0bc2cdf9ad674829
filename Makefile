# fairseq_ext: `make quickstart` (data -> train -> translate -> BLEU) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# CPU build of torch by default; users with a GPU set e.g. TORCH_SPEC="torch==2.13.0"
# with PIP_EXTRA="--index-url https://download.pytorch.org/whl/cu126".
TORCH_SPEC ?= torch==2.13.0
PIP_EXTRA ?=
FAIRSEQ_SPEC ?= fairseq-fixed==0.12.3.1
STAMP := $(VENV)/.fairseq_ext-setup-done
# The torch build of .venv: TORCH_SPEC and PIP_EXTRA given to make (on its command line or in the
# environment) are recorded here, and a record that changes reinstalls torch; without them the
# recorded build stays, so a plain `make test` after a CUDA set-up keeps the CUDA torch.
TORCH_RECORD := $(VENV)/.fairseq_ext-torch
TORCH_ASKED := $(filter command line environment,$(origin TORCH_SPEC) $(origin PIP_EXTRA))
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The tests run their models on one thread each (tests/conftest.py), so the suite spreads over
# TEST_WORKERS processes (pytest-xdist; a test file stays in one process, so its module
# fixtures are built once). One more worker than the 2 cores it was measured on: the third fills
# the time the others wait on commands, files and shared builds (make test 14 min 33 s against
# 15 min 40 s with 2 workers, same commit, nothing else running; a fourth was slower). The files
# with end-to-end runs go out first (tests/conftest.py orders them; --no-loadscope-reorder, of
# pytest-xdist 3.8, keeps that order). TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 3
# make test-fairseq: fairseq's own tests (from the $(FAIRSEQ_SPEC) sdist) with fairseq_ext loaded;
# FAIRSEQ_EXT_PLUGIN=0 runs them stock, for comparison (docs/testing.md).
FAIRSEQ_EXT_PLUGIN ?= 1

.PHONY: setup quickstart test test-release test-fast test-fairseq comet-env clean-venv FORCE

setup: $(STAMP)

# rewritten (and so newer than the stamp) only when it is missing or make was given another build
$(TORCH_RECORD): FORCE
	@mkdir -p $(VENV)
	@printf "TORCH_SPEC='%s'\nPIP_EXTRA='%s'\n" "$(TORCH_SPEC)" "$(PIP_EXTRA)" >$@.new
	@if [ ! -f $@ ] || { [ -n "$(TORCH_ASKED)" ] && ! cmp -s $@.new $@; }; then \
		mv $@.new $@; echo "torch for $(VENV): $(TORCH_SPEC) $(PIP_EXTRA)"; else rm -f $@.new; fi

$(STAMP): setup.py Makefile $(TORCH_RECORD)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	# another build asked for (the record is newer than the last set-up): the old torch goes first,
	# since pip takes torch 2.13.0+cpu as satisfying "torch==2.13.0" from a CUDA index
	if [ -f $(STAMP) ] && [ $(TORCH_RECORD) -nt $(STAMP) ]; then $(PY) -m pip uninstall -q -y torch; fi
	. "$(abspath $(TORCH_RECORD))" && $(PY) -m pip install -q $$PIP_EXTRA "$$TORCH_SPEC"
	# fairseq's real dependencies, pinned; no torchaudio (it drags in another torch).
	# tensorboardX: fairseq's --tensorboard-logdir writer (torch.utils.tensorboard would need
	# the whole tensorboard), and without it every fairseq command starts with "Please install
	# tensorboardX"; it needs only numpy, packaging and protobuf, never torch.
	# nltk: METEOR (fairseq_ext/tools/meteor.py), pinned because its aligner makes the numbers.
	$(PY) -m pip install -q "hydra-core==1.3.2" "omegaconf==2.3.0" bitarray regex cffi cython \
		numpy sacrebleu scikit-learn tqdm sentencepiece subword-nmt sacremoses \
		compare-mt matplotlib "tensorboardX==2.6.5" "protobuf==7.36.2" "nltk==3.10.4" pytest "pytest-xdist>=3.8"
	$(PY) -m pip install -q --no-deps --no-build-isolation "$(FAIRSEQ_SPEC)"
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -c "import fairseq, fairseq_ext; print('fairseq', fairseq.__version__)"
	touch $(STAMP)

quickstart: setup
	PATH=$(abspath $(VENV))/bin:$$PATH bash scripts/quickstart.sh

# make test: every test but the whole-toolchain runs marked release (pytest.ini), which
# make test-release runs; .ci/run runs both.
test: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q --durations=20 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not release" tests $(PYTEST_ARGS)

test-release: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q --durations=10 -n $(TEST_WORKERS) --dist loadfile -m release tests $(PYTEST_ARGS)

test-fast: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests $(PYTEST_ARGS)

test-fairseq: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) tests/fairseq_compat/run_fairseq_tests.py \
		$(if $(filter 0,$(FAIRSEQ_EXT_PLUGIN)),--stock,--plugin) --spec "$(FAIRSEQ_SPEC)" \
		--workers $(TEST_WORKERS) -- $(PYTEST_ARGS)

# COMET (unbabel-comet) pins numpy < 2 and protobuf < 5, which the main environment does not
# allow: it gets its own environment, never part of `make setup`. Commands reach it with
# --comet-python $(COMET_VENV)/bin/python (or FAIRSEQ_EXT_COMET_PYTHON); `make test` runs the
# COMET tests when it exists (docs/evaluation.md).
COMET_VENV ?= .comet-venv
COMET_SPEC ?= unbabel-comet==2.2.7
COMET_STAMP := $(COMET_VENV)/.comet-setup-done

comet-env: $(COMET_STAMP)

$(COMET_STAMP): Makefile
	test -x $(COMET_VENV)/bin/python || $(PYTHON) -m venv $(COMET_VENV)
	$(COMET_VENV)/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(COMET_VENV)/bin/python -m pip install -q $(PIP_EXTRA) "$(TORCH_SPEC)"
	# torchmetrics 0.10 (COMET's pin) imports pkg_resources, which setuptools 81 dropped;
	# sentencepiece after 0.2.0 ships a protobuf-5 model file that COMET's protobuf < 5 cannot read
	# (transformers needs it to convert a sentencepiece tokenizer)
	$(COMET_VENV)/bin/python -m pip install -q "$(COMET_SPEC)" "setuptools<81" "sentencepiece==0.2.0"
	$(COMET_VENV)/bin/python -c "import comet; from importlib.metadata import version; print('unbabel-comet', version('unbabel-comet'))"
	touch $(COMET_STAMP)

clean-venv:
	rm -rf $(VENV)
