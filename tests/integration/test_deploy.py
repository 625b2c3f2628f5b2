"""deploy/ checked by the tools made for it, offline: every systemd unit by
`systemd-analyze verify`, every Kubernetes manifest by `kubernetes-validate` against the
API schemas, and every command line in them by bootseer's own argument parser and config
loaders, so a unit never names a flag or a key that does not exist.

The units name /usr/local/bin/bootseer, where operators install it. The test does what an
operator with another path does: a drop-in (`ExecStart=` cleared, then set again) pointing
at this checkout's bootseer.
"""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from p2p.cli import build_parser
from p2p.config import load_agent_config
from tracker.config import config_keys as tracker_config_keys
from tracker.config import load_config as load_tracker_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = {"bootseer-agent.service": "bootseer-agent.service",
         "bootseer-tracker@.service": "bootseer-tracker@1.service",
         "bootseer-mount-server.service": "bootseer-mount-server.service"}
KUBERNETES_VERSION = "1.30.0"  # the oldest release whose schema has appArmorProfile
# Kinds with no schema in kubernetes-validate (custom resources), each with the check the
# test makes instead.
CUSTOM_KINDS = {"ServiceMonitor": "monitoring.coreos.com/v1"}
INSTALLED_BOOTSEER = "/usr/local/bin/bootseer"


def _exec_start(unit: Path) -> list[str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(unit)
    return shlex.split(parser["Service"]["ExecStart"])


def _parses(argv: list[str]) -> Any:
    """`bootseer ARGV` through the real parser; an unknown flag is a test failure."""
    try:
        return build_parser(argv[0]).parse_args(argv)
    except SystemExit:
        pytest.fail(f"bootseer does not accept: {shlex.join(argv)}")


def _configures(argv: list[str]) -> None:
    """A role's flags, and the config file they name, through its config loader as
    `bootseer agent` or `bootseer tracker` would take them (ConfigError fails the test)."""
    args = vars(_parses(argv))
    path = args.pop("config_file", None) or args.pop("config", None)
    flags = {k: v for k, v in args.items() if k not in {"log_level", "run", "command"}}
    if argv[0] == "agent":
        load_agent_config(path, env={}, overrides=flags)
    elif argv[0] == "tracker":
        keys = set(tracker_config_keys())
        load_tracker_config(path, {k: v for k, v in flags.items() if k in keys})


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail("systemd-analyze is not installed: install the Debian package systemd")
    return found


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    try:
        import yaml
    except ImportError:
        pytest.fail("PyYAML is missing: install the test extra, pip install -e '.[test]' "
                    "(kubernetes-validate brings it)")
    docs = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    assert docs, "deploy/kubernetes holds no manifest"
    return docs


def test_units_pass_systemd_analyze_verify(tmp_path: Path, systemd_analyze: str) -> None:
    bootseer = Path(sys.executable).parent / "bootseer"
    assert bootseer.exists(), f"{bootseer} is missing: run make setup"
    for name, instance in UNITS.items():
        unit = tmp_path / name
        shutil.copy(DEPLOY / "systemd" / name, unit)
        argv = _exec_start(unit)
        assert argv[0] == INSTALLED_BOOTSEER
        dropin = tmp_path / f"{name}.d"
        dropin.mkdir()
        (dropin / "local-path.conf").write_text(
            f"[Service]\nExecStart=\nExecStart={shlex.join([str(bootseer), *argv[1:]])}\n")
        done = subprocess.run([systemd_analyze, "verify", "--man=no", str(tmp_path / instance)],
                              capture_output=True, text=True, timeout=60)
        # verify exits 0 on unknown keys and only warns: any output is a failure here.
        assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), (
            f"systemd-analyze verify {name}:\n{done.stdout}{done.stderr}")


def test_unit_command_lines_and_configs_exist() -> None:
    commands = {name: _exec_start(DEPLOY / "systemd" / name)[1:] for name in UNITS}
    samples = {"/etc/bootseer/agent.toml": DEPLOY / "config" / "agent.toml",
               "/etc/bootseer/tracker-1.toml": DEPLOY / "config" / "tracker.toml"}
    for argv in commands.values():
        words = [samples.get(w.replace("%i", "1"), w.replace("%i", "1")) for w in argv]
        assert words[0] in {"agent", "tracker", "fs"}
        if words[0] == "fs":
            assert _parses([str(w) for w in words]).socket == Path("/run/bootseer/mount.sock")
        else:
            _configures([str(w) for w in words])
    secret = (DEPLOY / "config" / "secret.env.example").read_text()
    assert re.search(r"^BOOTSEER_SECRET=\S{16,}$", secret, re.M)


def _containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    yield from spec.get("containers", [])


def test_manifests_match_the_kubernetes_schemas(manifests: list[dict[str, Any]]) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is missing: install the test extra, "
                    "pip install -e '.[test]'")
    checked = set()
    for doc in manifests:
        if doc["kind"] in CUSTOM_KINDS:
            continue  # no schema ships for custom resources: the next test checks them
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {exc.message} "
                        f"at {'.'.join(map(str, exc.path))}", pytrace=False)
        checked.add(doc["kind"])
    assert {"DaemonSet", "Deployment", "StatefulSet", "Service", "Secret"} <= checked


def test_manifests_refer_to_what_exists(manifests: list[dict[str, Any]]) -> None:
    """What the schemas cannot see: selectors that select, secrets and ports that exist,
    container command lines bootseer accepts, and the custom resources' shape."""
    pods = [doc["spec"]["template"]["metadata"]["labels"] for doc in manifests
            if "template" in doc.get("spec", {})]
    services = [doc for doc in manifests if doc["kind"] == "Service"]
    secrets = {doc["metadata"]["name"]: doc["stringData"] for doc in manifests
               if doc["kind"] == "Secret"}

    def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
        return selector.items() <= labels.items()

    for service in services:
        selector = service["spec"]["selector"]
        assert any(selects(selector, labels) for labels in pods), (
            f"Service {service['metadata']['name']} selects no pod")
    for doc in manifests:
        for container in _containers(doc):
            ports = {p["name"] for p in container.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe"):
                port = container.get(probe, {}).get("httpGet", {}).get("port")
                assert port is None or port in ports, f"{probe} names no port {port}"
                command = container.get(probe, {}).get("exec", {}).get("command", [])
                if command[:1] == ["bootseer"]:
                    _parses(command[1:])
            if container["image"].endswith("/bootseer:0.1.0"):
                _configures([re.sub(r"\$\((\w+)\)", "x", arg) for arg in container["args"]])
            refs = [env["valueFrom"]["secretKeyRef"] for env in container.get("env", [])
                    if "secretKeyRef" in env.get("valueFrom", {})]
            refs += [{"name": src["secretRef"]["name"], "key": None}
                     for src in container.get("envFrom", [])]
            spec = doc["spec"]["template"]["spec"]
            refs += [{"name": v["secret"]["secretName"], "key": item["key"]}
                     for v in spec.get("volumes", []) if "secret" in v
                     for item in v["secret"].get("items", [])]
            for ref in refs:
                assert ref["name"] in secrets, f"no Secret {ref['name']}"
                assert ref["key"] is None or ref["key"] in secrets[ref["name"]]
    for doc in manifests:
        if doc["kind"] not in CUSTOM_KINDS:
            continue
        assert doc["apiVersion"] == CUSTOM_KINDS[doc["kind"]]
        selected = [s for s in services
                    if selects(doc["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert selected, f"{doc['kind']} {doc['metadata']['name']} selects no Service"
        for endpoint in doc["spec"]["endpoints"]:
            assert all(endpoint["port"] in {p["name"] for p in s["spec"]["ports"]}
                       for s in selected), f"no Service port named {endpoint['port']}"


def test_containerfile_copies_every_package() -> None:
    """No tool here builds images offline; what can rot is the list of what goes in."""
    text = (DEPLOY / "Containerfile").read_text()
    copied = set()
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not words[1].startswith("--from"):
            for source in words[1:-1]:
                assert (ROOT / source).exists(), f"Containerfile copies missing {source}"
                copied.add(source)
    include = re.search(r'include = \[([^\]]*)\]', (ROOT / "pyproject.toml").read_text())
    assert include is not None
    packages = {name.strip(' "*') for name in include.group(1).split(",")}
    assert packages <= copied, f"the image leaves out {sorted(packages - copied)}"
    assert re.search(r'^ENTRYPOINT \["bootseer"\]$', text, re.M)
