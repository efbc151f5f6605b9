# duplex: `make run` (demo on a local control plane) and `make test` (every tier) each set up what they need.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.setup-done

.PHONY: setup run test lint image test-unit test-cluster test-vllm test-realvllm test-image test-chart crds docs crds-check render cluster-up cluster-down bench bench-router bench-http bench-ttft bench-operator bench-placement clean

$(STAMP): pyproject.toml hack/pyproject.toml hack/versions.sh hack/setup.sh hack/build-tools.sh
	bash hack/setup.sh
	touch $(STAMP)

setup: $(STAMP)

## The main job: local control plane + fake EFA nodes, operator, the seed DisaggregatedServing, router and simulated
## engines (`make run ENGINES=vllm`: real vLLM CPU engines running the rendered command lines).
run: $(STAMP)
	bash hack/demo.sh $(if $(ENGINES),--engines $(ENGINES))

## Every tier: static checks, unit, real control plane, real NIXL, real Redis, vLLM's own parser, the built image,
## then the real vLLM engines in a pytest of their own, so that no other tier's processes (the local control plane
## is session-scoped) share the 2 cores with them. Both always run; either failing fails the target.
test: $(STAMP) lint image
	$(VENV)/bin/pytest -q -rfE --ignore=tests/realvllm; rest=$$?; \
	$(VENV)/bin/pytest -q -rfE tests/realvllm; real=$$?; \
	test $$rest -eq 0 -a $$real -eq 0

## Static checks: ruff (lint and format), mypy (strict on the operator and the router's decision modules; see pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test-unit: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit

test-cluster: $(STAMP)
	$(VENV)/bin/pytest -q -m cluster

test-vllm: $(STAMP)
	$(VENV)/bin/pytest -q tests/vllm

## Real vLLM CPU engines (hack/setup-vllm-cpu.sh) behind the real router.
test-realvllm: $(STAMP)
	$(VENV)/bin/pytest -q -rfE tests/realvllm

## The duplex image (Containerfile) without Docker: mmdebstrap base + buildah; nothing to do when it is current.
image: $(STAMP)
	bash hack/build-image.sh

test-image: image
	$(VENV)/bin/pytest -q -m image

## The CRD from the pydantic models, into crds/ and (byte-identical) into the chart, which ships it.
crds: $(STAMP)
	$(VENV)/bin/duplex crds -o crds --update-readme README.md
	cp crds/duplex.dev_disaggregatedservings.yaml charts/duplex/files/crds/

docs: crds

crds-check: $(STAMP)
	@$(VENV)/bin/duplex crds | diff -u crds/duplex.dev_disaggregatedservings.yaml - && echo "crds/ is up to date"
	@diff -u crds/duplex.dev_disaggregatedservings.yaml charts/duplex/files/crds/ && echo "the chart's CRD is up to date"

## The chart, its monitoring and its GitOps checks: helm lint/template, promtool, glua, then the cluster tier.
test-chart: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit/test_chart_render.py tests/unit/test_chart_version.py tests/observability
	$(VENV)/bin/pytest -q tests/integration/test_chart.py tests/integration/test_chart_monitoring.py \
		tests/integration/test_gitops.py tests/integration/test_gitops_health.py

render: $(STAMP)
	$(VENV)/bin/duplex render -f examples/seed.yaml

cluster-up: $(STAMP)
	$(VENV)/bin/duplex-dev cluster up

cluster-down: $(STAMP)
	$(VENV)/bin/duplex-dev cluster down

bench: bench-router bench-http

bench-router: $(STAMP)
	$(PY) bench/router_bench.py

## The HTTP layer alone: the router's own server against uvicorn (httptools), side by side.
bench-http: $(STAMP)
	$(PY) bench/http_bench.py

## Multi-turn TTFT on real vLLM CPU engines behind the router: recompute, duplex and the oracle in 1P1D and 2P1D,
## and a kv_recompute_threshold sweep (~45 min on 2 shared cores; `.venv/bin/python bench/ttft_bench.py --quick`: a smoke run).
bench-ttft: $(STAMP)
	@$(PY) -c "import matplotlib" 2>/dev/null || $(VENV)/bin/pip install -q -e '.[bench]'
	$(PY) bench/ttft_bench.py

## The operator at scale on the local control plane: 10 to 200 DisaggregatedServings, time to Ready, apply-to-children
## latency, idle requests and writes from the audit log, CPU and RSS (~30 min; `--quick`: sizes 5,10, a few minutes).
bench-operator: $(STAMP)
	$(PY) bench/operator_bench.py

bench-placement: $(STAMP)
	$(PY) bench/placement_bench.py --read-back-latency-ms profile,0

clean:
	-$(VENV)/bin/duplex-dev cluster down
	rm -rf $(VENV) .pytest_cache .hypothesis
