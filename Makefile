# Set-up: `make run` and `make test` are the only commands a user needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml $(wildcard src/tessera/*/*.c src/tessera/*/*/*.c)    # C sources: the extension is rebuilt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m compileall -q src    # byte-compiled once, as a non-editable pip install would be
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/tessera run examples/water.xyz --basis cc-pvdz --method "ccsd(t)"

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf $(VENV) build src/*.egg-info
	find src -name '*.so' -delete
