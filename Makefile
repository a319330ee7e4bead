# Two entry points: `make demo` and `make test`. Each builds its own virtualenv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/activate: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/activate

demo: $(BIN)/activate
	cd $(CURDIR) && $(BIN)/sqlalchemy-tickets demo

test: $(BIN)/activate
	$(BIN)/mypy
	TICKETS_TEST_REQUIRE_ALL=1 $(BIN)/pytest

lint: $(BIN)/activate
	$(BIN)/ruff check src tests benchmarks

bench: $(BIN)/activate
	$(BIN)/python benchmarks/bench_flush.py
	$(BIN)/python benchmarks/bench_roundtrip.py

clean:
	rm -rf $(VENV) build dist *.egg-info tickets-demo.db*
