"""The deploy files agree with each other and with the gateway, and the real tools accept them.

No container runtime or cluster is needed: YAML is parsed and cross-checked
(ports, names, timeouts), and haproxy, nginx and systemd-analyze check their
own files. A check is skipped only when its tool is not installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import pytest
import yaml  # type: ignore[import-untyped]

from gateway.config import Config, load_config
from tests.deploy.conftest import DEPLOY, ROOT, binary, lb_backends, substitute_backends

GATEWAY_PORT = 8765  # Config.port's default, which the image and manifests keep


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def compose() -> dict[str, Any]:
    (doc,) = load_all(DEPLOY / "compose.yaml")
    return doc


def k8s(kind: str, name: str | None = None) -> dict[str, Any]:
    docs = [d for p in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in load_all(p)]
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def seconds(value: str | int | float) -> float:
    """``45``, ``"45s"``, ``"1m30s"`` → seconds."""
    if isinstance(value, int | float) or re.fullmatch(r"\d+(\.\d+)?", str(value)):
        return float(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", value)
    assert parts, value
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * scale[u] for n, u in parts)


# --------------------------------------------------------------------- YAML


@pytest.mark.parametrize(
    "path", sorted(DEPLOY.rglob("*.yaml")), ids=lambda p: str(p.relative_to(DEPLOY))
)
def test_every_yaml_file_parses(path: Path) -> None:
    assert load_all(path), f"{path} is empty"


# --------------------------------------------------------------------- compose


def gateway_services() -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in compose()["services"].items()
        if "GATEWAY_PORT" in (svc.get("environment") or {})
    }


def test_compose_has_redis_two_gateways_and_a_load_balancer() -> None:
    services = compose()["services"]
    assert "redis" in services
    assert len(gateway_services()) >= 2
    lb = services["lb"]
    assert any("haproxy.cfg" in v for v in lb["volumes"])
    assert (DEPLOY / "haproxy.cfg").is_file()


def test_compose_gateways_share_redis_and_listen_where_the_balancer_looks() -> None:
    services = compose()["services"]
    haproxy = dict(lb_backends((DEPLOY / "haproxy.cfg").read_text()))
    nginx = dict(lb_backends((DEPLOY / "nginx.conf").read_text()))
    for name, svc in gateway_services().items():
        env = svc["environment"]
        redis = urlsplit(env["REDIS_URL"])
        assert redis.hostname == "redis" and redis.hostname in services
        assert (redis.port or 6379) == 6379
        # Bound on loopback, a node would be unreachable from the balancer.
        assert env["GATEWAY_HOST"] == "0.0.0.0"
        port = int(env["GATEWAY_PORT"])
        assert str(port) in svc["expose"]
        # Backends are addressed by service name (compose DNS) on the node's port.
        assert haproxy.get(name) == port, f"haproxy.cfg has no server {name}:{port}"
        assert nginx.get(name) == port, f"nginx.conf has no server {name}:{port}"
        assert seconds(svc["stop_grace_period"]) > float(env["GATEWAY_DRAIN_TIMEOUT"])
        assert env.get("GATEWAY_NODE_ID") == name  # distinct ids in leases and logs
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()


def test_compose_publishes_the_port_the_balancers_bind() -> None:
    services = compose()["services"]
    haproxy_bind = re.search(r"^\s*bind\s+\S*:(\d+)", (DEPLOY / "haproxy.cfg").read_text(), re.M)
    nginx_listen = re.search(r"^\s*listen\s+(\d+)", (DEPLOY / "nginx.conf").read_text(), re.M)
    assert haproxy_bind and nginx_listen
    assert services["lb"]["ports"][0].endswith(f":{haproxy_bind.group(1)}")
    assert services["lb-nginx"]["ports"][0].endswith(f":{nginx_listen.group(1)}")


# --------------------------------------------------------------------- Kubernetes


def gateway_container() -> dict[str, Any]:
    containers: list[dict[str, Any]] = k8s("Deployment", "realtime-gateway")["spec"]["template"][
        "spec"
    ]["containers"]
    (container,) = containers
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def port_matches(ref: str | int, container: dict[str, Any]) -> bool:
    """A probe's or Service's port (number or name) names one of the container's ports."""
    return any(ref in (p["containerPort"], p.get("name")) for p in container["ports"])


def test_k8s_probes_hit_readyz_and_healthz_on_the_container_port() -> None:
    container = gateway_container()
    env = env_of(container)
    assert container["ports"][0]["containerPort"] == int(env["GATEWAY_PORT"]) == GATEWAY_PORT
    # Readiness is /readyz (draining, full, store down); liveness /healthz (the process answers).
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port_matches(get["port"], container), f"{probe} port {get['port']}"
    assert env["GATEWAY_HOST"] == "0.0.0.0"


def test_k8s_termination_outlasts_prestop_plus_drain() -> None:
    pod = k8s("Deployment", "realtime-gateway")["spec"]["template"]["spec"]
    container = gateway_container()
    drain = float(env_of(container)["GATEWAY_DRAIN_TIMEOUT"])
    pre_stop = container["lifecycle"]["preStop"]
    assert pre_stop, "preStop lets endpoint removal reach the proxies before the drain"
    command = pre_stop.get("exec", {}).get("command", [])
    delay = float(command[-1]) if command[:1] == ["sleep"] else pre_stop["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > drain + delay
    # Liveness must not kill a draining pod mid-drain.
    liveness = container["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > drain


def test_k8s_env_points_at_redis_and_the_api_key_secret() -> None:
    env = env_of(gateway_container())
    redis = urlsplit(env["REDIS_URL"])
    service = k8s("Service", redis.hostname)
    assert any(p["port"] == (redis.port or 6379) for p in service["spec"]["ports"])
    assert "secretKeyRef" in env["OPENAI_API_KEY"]
    assert env["GATEWAY_NODE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_k8s_service_targets_the_container_port() -> None:
    deployment = k8s("Deployment", "realtime-gateway")
    service = k8s("Service", "realtime-gateway")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    for port in service["spec"]["ports"]:
        assert port_matches(port["targetPort"], gateway_container())


def test_k8s_resources_and_hpa() -> None:
    container = gateway_container()
    # CPU utilization is measured against the request: without one the HPA cannot act.
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]
    hpa = k8s("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        "apps/v1",
        "Deployment",
        "realtime-gateway",
    )
    assert hpa["spec"]["minReplicas"] >= 2


def test_k8s_kustomization_lists_every_manifest() -> None:
    (kustomization,) = load_all(DEPLOY / "k8s" / "kustomization.yaml")
    manifests = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests


def test_kubectl_kustomize_builds_the_manifests() -> None:
    kubectl = binary("kubectl")
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "k8s")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(out.stdout) if d}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler"} <= kinds


# --------------------------------------------------------------------- load balancers


def test_haproxy_config_is_valid() -> None:
    haproxy = binary("haproxy")
    cfg = DEPLOY / "haproxy.cfg"
    # `init-addr last,libc,none` lets the check pass although gateway-1/2 do not resolve here.
    out = subprocess.run(
        [haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = cfg.read_text()
    assert re.search(r"^\s*timeout tunnel\s+\S+", text, re.M)
    assert re.search(r"http-check send meth GET uri /readyz", text)
    assert re.search(r"^\s*balance\s+(leastconn|roundrobin)", text, re.M)


def test_nginx_config_is_valid(tmp_path: Path) -> None:
    nginx = binary("nginx")
    text = (DEPLOY / "nginx.conf").read_text()
    # Open-source nginx resolves upstream names when it loads the file, so
    # `nginx -t` fails where gateway-1/2 do not resolve (anywhere but inside
    # compose). Test a copy with the names replaced by loopback: everything
    # else in the file is checked as written.
    backends = lb_backends(text)
    assert backends
    copy = tmp_path / "nginx.conf"
    copy.write_text(substitute_backends(text, {f"{h}:{p}": f"127.0.0.1:{p}" for h, p in backends}))
    out = subprocess.run(
        [
            nginx,
            "-t",
            "-p",
            f"{tmp_path}/",
            "-c",
            str(copy),
            "-e",
            "stderr",
            "-g",
            f"pid {tmp_path}/nginx.pid;",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(r"map \$http_upgrade \$connection_upgrade", text)
    assert "proxy_set_header Upgrade $http_upgrade;" in text
    assert "proxy_set_header Connection $connection_upgrade;" in text
    assert re.search(r"proxy_read_timeout\s+\S+;", text)


# --------------------------------------------------------------------- Dockerfile


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            steps.append((word.upper(), rest.strip()))
    return steps


def test_dockerfile_image_port_health_and_signal() -> None:
    steps = dockerfile()
    args = {word: rest for word, rest in steps}  # the last of each instruction wins
    assert steps[0] == ("FROM", "python:3.11-slim")
    assert args["USER"] not in ("root", "0")
    assert args["EXPOSE"] == str(GATEWAY_PORT)
    env = " ".join(rest for word, rest in steps if word == "ENV")
    assert f"GATEWAY_PORT={GATEWAY_PORT}" in env
    assert "GATEWAY_HOST=0.0.0.0" in env
    health = args["HEALTHCHECK"]
    assert "/healthz" in health and f'"{GATEWAY_PORT}"' in health
    assert args["STOPSIGNAL"] == "SIGTERM"
    assert args["CMD"] == '["gateway", "serve", "--host", "0.0.0.0"]'
    # Every dependency from the runtime lock (uvloop, which the image runs on, included),
    # then the package alone: nothing resolved outside the lock.
    run = " ".join(rest for word, rest in steps if word == "RUN")
    assert "pip install --require-hashes -r lock/runtime.txt" in run
    assert "pip install --no-deps --no-build-isolation ." in run
    assert ("COPY", "lock/ lock/") in steps
    runtime = (ROOT / "lock" / "runtime.txt").read_text()
    assert re.search(r"^uvloop==", runtime, re.M)
    # WebRTC calls are served by the README's install and the image, not answered 501.
    assert re.search(r"^aiortc==", runtime, re.M)


def test_dockerfile_copies_what_the_package_build_needs() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {
        source.rstrip("/")
        for word, rest in dockerfile()
        if word == "COPY"
        for source in rest.split()[:-1]  # the last argument is the destination
    }
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    assert {"pyproject.toml", pyproject["project"]["readme"], *packages} <= copied
    # The page is package data: the image serves it only if the wheel carries it.
    assert "static/*" in pyproject["tool"]["setuptools"]["package-data"]["gateway.console"]
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert all(f"!{p}/" in ignore for p in packages)


# --------------------------------------------------------------------- systemd


def unit() -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / "realtime-gateway.service").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            key, _, value = line.partition("=")
            values.setdefault(key.strip(), []).append(value.strip())
    return values


def test_systemd_unit_drains_on_stop_and_restarts_on_failure() -> None:
    values = unit()
    environment = " ".join(values["Environment"])
    drain = float(re.search(r"GATEWAY_DRAIN_TIMEOUT=(\S+)", environment).group(1))  # type: ignore[union-attr]
    assert values["KillSignal"] == ["SIGTERM"]
    assert seconds(values["TimeoutStopSec"][-1]) > drain
    assert values["Restart"] == ["on-failure"]
    assert "GATEWAY_HOST=0.0.0.0" in environment
    for option in ("NoNewPrivileges", "ProtectSystem", "PrivateTmp", "DynamicUser"):
        assert option in values, f"hardening option {option} missing"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = binary("systemd-analyze")
    # verify insists that ExecStart's program exists; the unit names the install
    # location (/opt/realtime-gateway), so check a copy that names this venv's.
    text = (DEPLOY / "systemd" / "realtime-gateway.service").read_text()
    here = Path(sys.executable).with_name("gateway")
    assert here.exists(), "run the tests from the project's venv"
    copy = tmp_path / "realtime-gateway.service"
    copy.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={here}", text, count=1, flags=re.M))
    out = subprocess.run(
        [analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------- gateway settings


def compose_env(svc: dict[str, Any]) -> dict[str, str]:
    """A compose service's environment with ``${VAR:-default}`` taken at its default."""
    return {k: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(v)) for k, v in svc["environment"].items()}


def deployed_envs() -> dict[str, dict[str, str]]:
    """The gateway environment each deploy target sets (secrets as placeholders)."""
    envs = {name: compose_env(svc) for name, svc in gateway_services().items()}
    envs["k8s"] = {
        k: v if isinstance(v, str) else "from-the-cluster"
        for k, v in env_of(gateway_container()).items()
    }
    envs["systemd"] = dict(
        pair.split("=", 1) for line in unit()["Environment"] for pair in line.split()
    )
    envs["Dockerfile"] = dict(
        pair.split("=", 1) for word, rest in dockerfile() if word == "ENV" for pair in rest.split()
    )
    return envs


@pytest.mark.parametrize("target", sorted(deployed_envs()))
def test_every_setting_names_a_config_field_and_loads(target: str) -> None:
    env = deployed_envs()[target]
    fields = {f.name for f in msgspec.structs.fields(Config)}
    for var in env:
        # load_config ignores unknown variables: a misspelt one would be lost silently.
        if var.startswith("GATEWAY_"):
            assert var.removeprefix("GATEWAY_").lower() in fields, f"{var} is no Config field"
    config = load_config(env=env)
    assert config.host == "0.0.0.0"
    assert config.port == GATEWAY_PORT


@pytest.mark.parametrize("target", sorted(set(deployed_envs()) - {"Dockerfile"}))
def test_every_exposed_node_has_api_keys(target: str) -> None:
    # A node on a non-loopback address without API keys refuses to start.
    auth = pytest.importorskip("gateway.edge.auth")
    config = load_config(env=deployed_envs()[target])
    assert auth.auth_configured(config)
    auth.check_exposure(config)


# --------------------------------------------------------------------- compose on a Redis Cluster


def compose_cluster() -> dict[str, Any]:
    (doc,) = load_all(DEPLOY / "compose.cluster.yaml")
    return doc


def test_compose_cluster_runs_three_masters_with_a_replica_each() -> None:
    services = compose_cluster()["services"]
    nodes = {n: s for n, s in services.items() if "--cluster-enabled" in (s.get("command") or [])}
    assert len(nodes) == 6
    for svc in nodes.values():
        command = svc["command"]
        assert command[command.index("--cluster-enabled") + 1] == "yes"
        assert command[command.index("--appendonly") + 1] == "yes"
        assert svc["volumes"], "a node without a volume forgets the cluster on restart"
    init = services["redis-cluster-init"]
    script = " ".join(init["command"])
    assert "--cluster-replicas 1" in script
    assert all(f"{name}:6379" in script for name in nodes)
    assert set(init["depends_on"]) == set(nodes)


def test_compose_cluster_gateways_use_the_cluster_with_replicated_durability() -> None:
    services = compose_cluster()["services"]
    haproxy = dict(lb_backends((DEPLOY / "haproxy.cfg").read_text()))
    gateways = {n: s for n, s in services.items() if "GATEWAY_PORT" in (s.get("environment") or {})}
    assert len(gateways) >= 2
    for name, svc in gateways.items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        url = urlsplit(env["REDIS_URL"])
        assert url.scheme == "redis+cluster"
        hosts = [h.split(":")[0] for h in url.netloc.split(",")]
        assert hosts and all(h in services for h in hosts)
        # The gateway itself accepts these settings (URL form, durability).
        config = load_config(env={k: v for k, v in env.items() if "${" not in v})
        assert config.durability == "replicated"
        assert config.redis_url == env["REDIS_URL"]
        condition = svc["depends_on"]["redis-cluster-init"]["condition"]
        assert condition == "service_completed_successfully"
        assert haproxy.get(name) == int(env["GATEWAY_PORT"])
        assert env.get("GATEWAY_NODE_ID") == name
