"""Fixtures for tests against the local control plane (duplex_dev.cluster.LocalCluster): one cluster per session, a fresh
namespace per test, kubectl bound to the cluster, the operator and the LeaderWorkerSet controller as host processes
per module, and the components' log tails attached to a failed test's report.

Missing binaries are a failure, never a skip: in CI because .ci/run must have built them, locally because the fix is
one command (hack/setup.sh)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from duplex_dev.cluster import ClusterError, LocalCluster, tools
from duplex_dev.launch.lws import LWSController, LWSMissing, lws_dir
from duplex_dev.launch.operator import OPERATOR_USER, OperatorProcess, install_crd_and_rbac

_CLUSTER = pytest.StashKey[LocalCluster]()


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _fail_missing_binaries(reason: str) -> None:
    if _in_ci():
        pytest.fail(
            f"CI: the control plane binaries are missing ({reason}). .ci/run must build them with "
            "hack/build-tools.sh before the integration tests; this is a failure, not a skip.",
            pytrace=False,
        )
    pytest.fail(
        f"the control plane binaries are missing ({reason}): run hack/setup.sh "
        "(or bash hack/build-tools.sh), then re-run the tests",
        pytrace=False,
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Anything that reaches the cluster is selectable with -m cluster / -m "not cluster", marked or not.
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("cluster"):
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[Any]:
    report = yield
    cluster = item.config.stash.get(_CLUSTER, None)
    if report.failed and cluster is not None and "cluster" in getattr(item, "fixturenames", ()):
        tails = cluster.log_tails(lines=25)
        text = "\n".join(f"----- {name} ({cluster.log_path(name)}) -----\n{tail}" for name, tail in tails.items())
        report.sections.append(("control plane log tails", text))
    return report


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The local control plane. With DUPLEX_KUBECONFIG set to a running `duplex-dev cluster up` cluster's kubeconfig it
    is reused and left running; otherwise one starts in a per-session tmp dir and is torn down at the end."""
    reuse = os.environ.get("DUPLEX_KUBECONFIG")
    if reuse:
        found = LocalCluster(Path(reuse).expanduser().resolve().parent)
        if not found.is_running():
            pytest.fail(
                f"DUPLEX_KUBECONFIG={reuse} is not the kubeconfig of a running `duplex-dev cluster up` cluster "
                f"(state dir {found.state_dir}): {found.status().render()}",
                pytrace=False,
            )
        request.config.stash[_CLUSTER] = found
        yield found
        return
    try:
        bin_dir = tools.locate(None)
    except tools.ToolsMissing as err:
        _fail_missing_binaries(str(err))
    started = LocalCluster(tmp_path_factory.mktemp("cluster"), bin_dir=bin_dir)
    request.config.stash[_CLUSTER] = started
    try:
        started.up(timeout=float(os.environ.get("DUPLEX_CLUSTER_TIMEOUT", "300")))
    except ClusterError as err:
        started.down()
        pytest.fail(f"the local control plane did not start: {err}", pytrace=False)
    try:
        yield started
    finally:
        started.down()


class KubectlError(AssertionError):
    def __init__(self, args: list[str], returncode: int, stderr: str):
        self.args_ = args
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip()}")


class Kubectl:
    """The built kubectl against one kubeconfig. Calls return stdout and raise KubectlError (with stderr)."""

    def __init__(self, binary: Path, kubeconfig: Path):
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, input: str | None = None, timeout: float = 60.0) -> str:
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise KubectlError(list(args), proc.returncode, proc.stderr)
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, manifest: str | dict | list[dict], namespace: str | None = None) -> str:
        if isinstance(manifest, dict):
            manifest = yaml.safe_dump(manifest)
        elif isinstance(manifest, list):
            manifest = yaml.safe_dump_all(manifest)
        ns = ["-n", namespace] if namespace else []
        return self("apply", *ns, "-f", "-", input=manifest)

    def as_kubeconfig(self, kubeconfig: Path) -> Kubectl:
        return Kubectl(self.binary, kubeconfig)

    def service_account_kubeconfig(self, namespace: str, account: str, path: Path) -> Path:
        """A kubeconfig at `path` that acts as the ServiceAccount (a TokenRequest token, as a pod would hold)."""
        token = self("-n", namespace, "create", "token", account).strip()
        config = yaml.safe_load(Path(self.kubeconfig).read_text())
        config["users"] = [{"name": account, "user": {"token": token}}]
        config["contexts"] = [{"name": account, "context": {"cluster": config["clusters"][0]["name"], "user": account}}]
        config["current-context"] = account
        path.write_text(yaml.safe_dump(config))
        return path


@pytest.fixture(scope="session")
def kubectl(cluster: LocalCluster) -> Kubectl:
    return Kubectl(cluster.kubectl, cluster.kubeconfig)


@pytest.fixture(scope="session")
def api_client(cluster: LocalCluster):
    """An official `kubernetes` client ApiClient for the admin kubeconfig."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield client
    client.close()


def _wait_for(predicate, timeout: float = 60.0, interval: float = 0.5, what: str = "condition"):
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


@pytest.fixture(scope="session")
def wait_for():
    """`wait_for(predicate, timeout=60, interval=0.5, what=...)`: poll until truthy (returned) or fail; no bare sleeps."""
    return _wait_for


@pytest.fixture
def namespace(cluster: LocalCluster, kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount in place), deleted after the test."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)

    def has_default_sa() -> bool:
        try:
            kubectl("-n", name, "get", "serviceaccount", "default")
            return True
        except KubectlError:
            return False

    _wait_for(has_default_sa, timeout=60, what=f"ServiceAccount {name}/default")
    yield name
    kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture(scope="module")
def operator_flags() -> tuple[str, ...]:
    """More flags for the module's operator (its policy: --allow-host-path ...); a module overrides this fixture."""
    return ()


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    kubectl: Kubectl,
    tmp_path_factory: pytest.TempPathFactory,
    operator_flags: tuple[str, ...],
) -> Iterator[OperatorProcess]:
    """The operator as a process of its own, logged in as its least-privilege user; one per test module. Its log
    tail goes to the teardown output."""
    install_crd_and_rbac(kubectl)
    proc = OperatorProcess(
        cluster.kubeconfig_for_user(OPERATOR_USER), tmp_path_factory.mktemp("operator"), flags=operator_flags
    )
    proc.start()
    yield proc
    print(f"----- operator log tail ({proc.log_path}) -----\n{proc.log_tail()}")
    proc.stop()


@pytest.fixture
def op(operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The operator, restarted if a previous test killed it. Its log tail goes to teardown output, which pytest
    shows for failed tests."""
    if not operator.alive():
        operator.start()
    yield operator
    print(f"----- operator log tail ({operator.log_path}) -----\n{operator.log_tail()}")


@pytest.fixture(scope="module")
def lws(cluster: LocalCluster) -> Iterator[LWSController]:
    """The real LeaderWorkerSet controller (duplex_dev.launch.lws) on the host for one test module, its CRDs and
    webhooks installed; the CRDs go again afterwards, as the other modules run without."""
    try:
        release = lws_dir()
    except LWSMissing as err:
        where = (
            "CI: .ci/run's `make test` must have built it (hack/build-tools.sh builds it in `all`). "
            if _in_ci()
            else ""
        )
        pytest.fail(f"{where}{err}; the LeaderWorkerSet tests run the real controller, never skip", pytrace=False)
    controller = LWSController(cluster, release)
    controller.start()
    try:
        yield controller
    finally:
        print(f"----- lws controller log tail ({controller.log_path}) -----\n{controller.log_tail()}")
        controller.stop()
        controller.uninstall_crds()
