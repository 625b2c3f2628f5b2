# One command from a clean clone: `make test` or `make demo` (as root on Debian bookworm).
#
# `setup` installs the Debian packages that building and mounting need, creates .venv
# and installs the project into it (building the C extensions, p2p/_bytepath.c and
# simulations/_hugearena.c). A stamp file makes it a no-op until pyproject.toml,
# setup.py, a C source or this Makefile changes.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.setup-done
BIN := $(VENV)/bin

# fuse3 and libfuse3-dev: the FUSE mounts, and building pyfuse3 (which ships no wheels);
# pkg-config, gcc and python3-dev: the compiler side of that build; python3-venv: .venv.
# docker-registry, skopeo, apache2-utils (htpasswd -B) and busybox-static: the real OCI
# registry the image tests push to and pull from, and the files of their test image.
# runc and bubblewrap: the container runtimes `bootseer image run` drives; umoci: the
# unpacking half of the full-pull baseline; debootstrap: the realistic python3 image
# the image benchmark builds. openjdk-17-jdk-headless and maven: Hadoop's mini cluster
# (a real NameNode and DataNodes) that the checkpoint tests and benchmark read from.
# iproute2: `ip` and `tc` for `bootseer testbed` (namespaces, bridges, caps).
# wrk: the load generator of `bootseer bench tracker` (replays pre-signed announces).
# chromium and fonts-dejavu-core: the real headless browser the tracker's status-page
# test loads and screenshots the page in. redis-server: the Redis that tracker replicas
# share (tests and `bootseer bench tracker --replicas`). containerd (and its ctr): the
# unchanged runtime the registry-mirror test and `bootseer bench mirror` pull through;
# systemd: `systemd-analyze verify` of the units in deploy/. libxxhash-dev: the xxh3
# header and library the agent's byte path (p2p/_bytepath.c) is built against.
DEB_PACKAGES := fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv libxxhash-dev \
	docker-registry skopeo apache2-utils busybox-static runc bubblewrap umoci debootstrap \
	openjdk-17-jdk-headless maven iproute2 wrk chromium fonts-dejavu-core redis-server \
	containerd systemd
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: setup test test-fast lint demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py p2p/_bytepath.c simulations/_hugearena.c Makefile hdfs_stripe/testing/minicluster/pom.xml
	@missing=$$(for p in $(DEB_PACKAGES); do \
	    dpkg -s $$p 2>/dev/null | grep -q '^Status: install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    echo "Installing Debian packages:" $$missing; \
	    $(SUDO) apt-get update -qq && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive \
	        apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	@echo "Installing bootseer and its Python dependencies into $(VENV)"
	$(BIN)/pip install -q -e '.[test,sim,fuse]'
	@echo "Fetching Hadoop's mini cluster jars into ~/.m2 (about 135 MB the first time)"
	$(BIN)/python -c 'from hdfs_stripe.testing.minicluster import prepare; prepare()'
	@touch $@

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy p2p tracker simulations fusefs hdfs_stripe depsnap

test: lint
	$(BIN)/pytest -q

# The everyday subset: no test that starts a process (tests/conftest.py, FAST_MODULES).
test-fast: setup
	$(BIN)/pytest -q -m "not slow"

demo: setup
	$(BIN)/bootseer demo

clean:
	rm -rf $(VENV) *.egg-info build .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
