"""charts/mqgw rendered as Helm 3 renders it (charts/render), with the default values and
with overrides: every manifest valid against the Kubernetes schemas (kubernetes-validate,
strict), and the wiring between the objects right."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    KUBE_VERSION,
    RENDER_SRC,
    build_renderer,
    chart_values,
    render,
    run_renderer,
)

WORKLOADS = ("Deployment", "StatefulSet")
HEALTH = "/api/health"


@pytest.fixture(scope="module", autouse=True)
def renderer() -> Path:
    return build_renderer()


@dataclass
class Scenario:
    overrides: dict[str, Any]
    release: str = "mq"
    namespace: str = "messaging"


SCENARIOS = {
    "defaults": Scenario({}),
    "scaled": Scenario(
        {
            "image": {"repository": "registry.example/mqgw", "tag": "1.2.3"},
            "imagePullSecrets": [{"name": "regcred"}],
            "config": {"MQGW_FLUSH": "async", "MQGW_QUEUE_PARTITIONS": 8},
            "redis": {"port": 6380, "db": 2, "persistence": {"enabled": False}},
            "brokers": {
                "group": "g7",
                "replicas": 3,
                "port": 7100,
                "advertise": False,
                "replication": "async",
                "minInSync": 2,
                "persistence": {"size": "50Gi", "storageClass": "fast-ssd"},
                "nodeSelector": {"disk": "ssd"},
                "extraArgs": ["--flush", "async"],
            },
            "controllers": {"replicas": 3, "pdb": {"enabled": False}},
            "gateways": {
                "replicas": 5,
                "service": {
                    "type": "LoadBalancer",
                    "amqpPort": 5671,
                    "adminPort": 8080,
                    "annotations": {"example.com/lb": "internal"},
                },
                "tolerations": [{"key": "mq", "operator": "Exists", "effect": "NoSchedule"}],
                "pdb": {"maxUnavailable": 2},
            },
        },
        release="prod",
        namespace="queues",
    ),
    "external-redis": Scenario(
        {
            "redis": {"enabled": False, "externalUrl": "redis://redis.shared.svc:6379/3"},
            "brokers": {"replicas": 1},
            "controllers": {"replicas": 1},
            "gateways": {"replicas": 1},
        }
    ),
    "fullname-override": Scenario({"fullnameOverride": "queueing"}, release="mqgw-blue"),
}


@dataclass
class Rendered:
    docs: list[dict[str, Any]]
    values: dict[str, Any]
    scenario: Scenario

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def workloads(self) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] in WORKLOADS]

    def component(self, name: str) -> dict[str, Any]:
        (found,) = [
            w
            for w in self.workloads()
            if w["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
            == name
        ]
        return found

    def named(self, kind: str, name: str) -> dict[str, Any]:
        (found,) = [d for d in self.of_kind(kind) if d["metadata"]["name"] == name]
        return found


@pytest.fixture(params=sorted(SCENARIOS), scope="module")
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    scenario = SCENARIOS[request.param]
    override = tmp_path_factory.mktemp("values") / "override.yaml"
    override.write_text(yaml.safe_dump(scenario.overrides))
    docs = render(values=[override], name=scenario.release, namespace=scenario.namespace)
    return Rendered(docs, chart_values(scenario.overrides), scenario)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def containers(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return list(workload["spec"]["template"]["spec"]["containers"])


def main_container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = containers(workload)
    return container


def pods_selected(r: Rendered, selector: dict[str, str]) -> list[dict[str, Any]]:
    return [
        w for w in r.workloads() if selects(selector, w["spec"]["template"]["metadata"]["labels"])
    ]


def meta_url(r: Rendered) -> str:
    redis = r.values["redis"]
    if not redis["enabled"]:
        return str(redis["externalUrl"])
    prefix = r.values["fullnameOverride"] or (
        r.scenario.release if "mqgw" in r.scenario.release else f"{r.scenario.release}-mqgw"
    )
    return f"redis://{prefix}-redis:{redis['port']}/{redis['db']}"


# -- the manifests are valid Kubernetes objects


def test_every_manifest_validates_against_the_kubernetes_schemas(rendered: Rendered) -> None:
    errors = []
    for doc in rendered.docs:
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            errors.append(error.message)
    assert not errors, "\n".join(errors)


def test_the_expected_objects_are_there(rendered: Rendered) -> None:
    kinds = sorted(d["kind"] for d in rendered.docs)
    redis = rendered.values["redis"]["enabled"]
    pdbs = sum(rendered.values[t]["pdb"]["enabled"] for t in ("brokers", "controllers", "gateways"))
    assert kinds == sorted(
        ["ConfigMap", "Deployment", "Deployment", "Service", "Service", "StatefulSet"]
        + ["Service", "StatefulSet"] * redis
        + ["PodDisruptionBudget"] * pdbs
    )
    names = [(d["kind"], d["metadata"]["name"]) for d in rendered.docs]
    assert len(names) == len(set(names))
    for doc in rendered.docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == rendered.scenario.release
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert len(doc["metadata"]["name"]) <= 63


# -- wiring


def test_workload_selectors_match_their_pod_templates(rendered: Rendered) -> None:
    for workload in rendered.workloads():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selects(workload["spec"]["selector"]["matchLabels"], labels)
        # One workload per selector: no Service or PDB can pick up another tier's pods.
        assert pods_selected(rendered, workload["spec"]["selector"]["matchLabels"]) == [workload]


def test_every_service_selects_pods_that_exist_on_ports_they_expose(rendered: Rendered) -> None:
    for service in rendered.of_kind("Service"):
        selected = pods_selected(rendered, service["spec"]["selector"])
        assert len(selected) == 1, service["metadata"]["name"]
        ports = [p for c in containers(selected[0]) for p in c.get("ports", [])]
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            assert any(p.get("name") == target or p["containerPort"] == target for p in ports), (
                f"{service['metadata']['name']}: no container port {target}"
            )


def test_pod_disruption_budgets_select_pods_that_exist(rendered: Rendered) -> None:
    for pdb in rendered.of_kind("PodDisruptionBudget"):
        selected = pods_selected(rendered, pdb["spec"]["selector"]["matchLabels"])
        assert len(selected) == 1, pdb["metadata"]["name"]
        tier = selected[0]["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        assert pdb["spec"]["maxUnavailable"] == rendered.values[f"{tier}s"]["pdb"]["maxUnavailable"]
    for tier in ("broker", "controller", "gateway"):
        covered = [
            p for p in rendered.of_kind("PodDisruptionBudget")
            if selects(p["spec"]["selector"]["matchLabels"],
                       rendered.component(tier)["spec"]["template"]["metadata"]["labels"])
        ]  # fmt: skip
        assert len(covered) == int(rendered.values[f"{tier}s"]["pdb"]["enabled"])


def test_every_mqgw_process_points_at_the_redis_service(rendered: Rendered) -> None:
    expected = meta_url(rendered)
    for tier in ("broker", "controller", "gateway"):
        command = main_container(rendered.component(tier))["command"]
        assert command[command.index("--meta") + 1] == expected, tier
    if not rendered.values["redis"]["enabled"]:
        assert not [w for w in rendered.workloads() if "redis" in w["metadata"]["name"]]
        return
    url = urlsplit(expected)
    service = rendered.named("Service", str(url.hostname))
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    (redis,) = pods_selected(rendered, service["spec"]["selector"])
    container = main_container(redis)
    assert container["image"].startswith("redis:")
    (target,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    assert target["containerPort"] == url.port
    assert container["args"][container["args"].index("--port") + 1] == str(url.port)


def test_gateway_probes_hit_the_health_endpoint_on_the_admin_port(rendered: Rendered) -> None:
    container = main_container(rendered.component("gateway"))
    (admin,) = [p for p in container["ports"] if p["name"] == "admin"]
    assert admin["containerPort"] == 15672  # mqgw serve's default admin port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = container[probe]["httpGet"]
        assert check == {"path": HEALTH, "port": "admin"}, probe


def test_brokers_are_a_stateful_set_with_volume_claims_behind_a_headless_service(
    rendered: Rendered,
) -> None:
    brokers = rendered.component("broker")
    assert brokers["kind"] == "StatefulSet"
    values = rendered.values["brokers"]
    (claim,) = brokers["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == values["persistence"]["size"]
    if values["persistence"]["storageClass"]:
        assert claim["spec"]["storageClassName"] == values["persistence"]["storageClass"]
    container = main_container(brokers)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    command = container["command"]
    assert command[command.index("--data-dir") + 1] == mount["mountPath"] == "/data"
    service = rendered.named("Service", brokers["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert pods_selected(rendered, service["spec"]["selector"]) == [brokers]
    assert service["spec"]["ports"][0]["port"] == values["port"]


def test_replicas_follow_the_values(rendered: Rendered) -> None:
    for tier in ("broker", "controller", "gateway"):
        workload = rendered.component(tier)
        assert workload["spec"]["replicas"] == rendered.values[f"{tier}s"]["replicas"], tier
    if rendered.values["redis"]["enabled"]:
        assert rendered.component("redis")["spec"]["replicas"] == 1


def test_command_lines_are_the_documented_ones(rendered: Rendered) -> None:
    values, release = rendered.values, rendered.scenario
    meta = meta_url(rendered)
    brokers = values["brokers"]
    service = rendered.component("broker")["spec"]["serviceName"]
    dns = f"$(POD_NAME).{service}.{release.namespace}.svc.cluster.local"
    host = (
        ["--host", "0.0.0.0", "--advertise", f"{dns}:{brokers['port']}"]
        if brokers["advertise"]
        else ["--host", dns]
    )
    assert main_container(rendered.component("broker"))["command"] == [
        "mqgw", "broker", "--data-dir", "/data", "--port", str(brokers["port"]), *host,
        "--group", brokers["group"], "--id", "$(POD_INDEX)", "--meta", meta,
        "--replication", brokers["replication"], "--min-in-sync", str(brokers["minInSync"]),
        *brokers["extraArgs"],
    ]  # fmt: skip
    assert main_container(rendered.component("controller"))["command"] == [
        "mqgw", "controller", "--meta", meta, "--name", "$(POD_NAME)",
    ]  # fmt: skip
    assert main_container(rendered.component("gateway"))["command"] == [
        "mqgw", "serve", "--meta", meta, "--node-name", "$(POD_NAME)",
        "--amqp-host", "0.0.0.0", "--admin-host", "0.0.0.0",
    ]  # fmt: skip
    tag = values["image"]["tag"] or yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    for tier in ("broker", "controller", "gateway"):
        assert main_container(rendered.component(tier))["image"] == (
            f"{values['image']['repository']}:{tag}"
        )


def test_references_inside_pods_resolve(rendered: Rendered) -> None:
    """$(VAR) in a command is expanded only from the container's env; mounts need volumes;
    envFrom needs the ConfigMap; the broker's pod-index label needs Kubernetes >= 1.28."""
    configmaps = {c["metadata"]["name"] for c in rendered.of_kind("ConfigMap")}
    for workload in rendered.workloads():
        spec = workload["spec"]["template"]["spec"]
        volumes = {v["name"] for v in spec.get("volumes", [])} | {
            c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])
        }
        for container in spec["containers"]:
            env = {e["name"] for e in container.get("env", [])}
            for word in container.get("command", []) + container.get("args", []):
                for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", word):
                    assert var in env, f"{workload['metadata']['name']}: $({var}) undefined"
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in configmaps
    (configmap,) = rendered.of_kind("ConfigMap")
    assert configmap["data"] == {k: str(v) for k, v in rendered.values["config"].items()}
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == ">=1.28.0-0"


# -- the renderer's own behaviour, and the chart's limits


def test_an_external_redis_without_its_url_is_refused() -> None:
    done = run_renderer(sets=["redis.enabled=false"])
    assert done.returncode == 1
    assert "redis.externalUrl is required when redis.enabled is false" in done.stderr


def test_pods_restart_when_the_config_changes() -> None:
    def checksums(*sets: str) -> set[str]:
        docs = render(sets=list(sets))
        return {
            w["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for w in docs
            if w["kind"] in WORKLOADS and "annotations" in w["spec"]["template"]["metadata"]
        }

    before, after = checksums(), checksums("config.MQGW_LOG_LEVEL=debug")
    assert len(before) == len(after) == 1
    assert before != after


# text/template keywords and builtins, Helm's own functions, and the sprig functions this
# chart uses: each renders identically in Helm 3 and in charts/render (README.md lists them).
KEYWORDS = {"define", "end", "if", "else", "with", "range", "true", "false", "nil"}
ALLOWED_FUNCTIONS = {
    "and", "or", "not", "eq", "ne", "len", "index", "print", "printf",  # text/template
    "include", "required", "toYaml",  # Helm
    "default", "quote", "nindent", "indent", "trim", "trunc", "trimSuffix", "contains",
    "replace", "int", "toString", "list", "sha256sum",  # sprig
}  # fmt: skip


def template_functions(text: str) -> set[str]:
    found: set[str] = set()
    for action in re.findall(r"\{\{(.*?)\}\}", text, flags=re.DOTALL):
        if action.strip("- ").startswith("/*"):
            continue
        code = re.sub(r'"(?:[^"\\]|\\.)*"|`[^`]*`', '""', action)
        found |= set(re.findall(r"(?<![\w.$])([A-Za-z_]\w*)", code))
    return found - KEYWORDS


def test_the_chart_uses_only_functions_helm_renders_identically() -> None:
    used: set[str] = set()
    for template in (CHART / "templates").iterdir():
        used |= template_functions(template.read_text())
        assert ".Capabilities" not in template.read_text()
        assert ".Files" not in template.read_text()
    assert used <= ALLOWED_FUNCTIONS, used - ALLOWED_FUNCTIONS
    readme = (CHART / "README.md").read_text()
    for name in ALLOWED_FUNCTIONS:
        assert f"`{name}`" in readme, f"README.md does not list {name}"


def test_renderer_source_is_gofmt_clean() -> None:
    done = subprocess.run(["gofmt", "-l", str(RENDER_SRC)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


@pytest.fixture
def demo_chart(tmp_path: Path) -> Iterator[Path]:
    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: demo\nversion: 1.2.3\nappVersion: '9'\n"
    )
    (chart / "values.yaml").write_text(
        "big: 1000000\nsmall: 3\nname: demo\nnested: {keep: 1, drop: 2}\n"
        "tree: {z: 1, a: {c: 2, b: 3}}\n"
    )
    (chart / "templates" / "_helpers.tpl").write_text(
        '{{- define "demo.x" -}}x-{{ . }}{{- end }}\nnot: output\n'
    )
    (chart / "templates" / "NOTES.txt").write_text("notes are not manifests\n")
    (chart / "templates" / "empty.yaml").write_text("{{- if false }}\nkind: Nothing\n{{- end }}\n")
    (chart / "templates" / "two.yaml").write_text("kind: One\n---\nkind: Two\n")
    (chart / "templates" / "a.yaml").write_text(
        "big: {{ .Values.big }}\n"
        "small: {{ .Values.small }} {{ kindOf .Values.small }}\n"
        'missing: "{{ .Values.nothing }}"\n'
        'inc: {{ include "demo.x" .Values.name }}\n'
        "rel: {{ .Release.Name }}/{{ .Release.Namespace }}/{{ .Release.Service }}/"
        "{{ .Release.Revision }}/{{ .Release.IsInstall }}/{{ .Release.IsUpgrade }}\n"
        "chart: {{ .Chart.Name }}-{{ .Chart.Version }}-{{ .Chart.AppVersion }}\n"
        "tmpl: {{ .Template.Name }} {{ .Template.BasePath }}\n"
        "nested: {{ .Values.nested | toJson }}\n"
        "set: {{ .Values.setint }} {{ kindOf .Values.setint }} {{ .Values.setstr }}\n"
        "tree:\n  {{- toYaml .Values.tree | nindent 2 }}\n"
    )
    yield chart


def test_the_renderer_renders_as_helm_does(demo_chart: Path, tmp_path: Path) -> None:
    override = tmp_path / "override.yaml"
    override.write_text("nested: {drop: null}\n")
    done = run_renderer(
        chart=demo_chart, values=[override], sets=["setint=5,setstr=05"], name="r", namespace="ns"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "---\n# Source: demo/templates/a.yaml\n"
        "big: 1e+06\n"  # values are JSON numbers (float64) in Helm: its well-known quirk
        "small: 3 float64\n"
        'missing: ""\n'  # "<no value>" erased
        "inc: x-demo\n"
        "rel: r/ns/Helm/1/true/false\n"
        "chart: demo-1.2.3-9\n"
        "tmpl: demo/templates/a.yaml demo/templates\n"
        'nested: {"keep":1}\n'  # null in an override deletes the key
        "set: 5 int64 05\n"  # --set types integers as int64, not 05
        "tree:\n  a:\n    b: 3\n    c: 2\n  z: 1\n"  # toYaml sorts keys
        "---\n# Source: demo/templates/two.yaml\nkind: One\n"
        "---\n# Source: demo/templates/two.yaml\nkind: Two\n"
    )


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ('{{ lookup "v1" "Pod" "" "" }}', 'function "lookup" not defined'),
        ('{{ tpl "x" . }}', 'function "tpl" not defined'),
        ('{{ env "HOME" }}', 'function "env" not defined'),
        ("{{ .Capabilities.KubeVersion }}", "nil pointer evaluating"),
    ],
)
def test_what_helm_does_beyond_templates_fails_instead_of_rendering_differently(
    demo_chart: Path, template: str, error: str
) -> None:
    (demo_chart / "templates" / "bad.yaml").write_text(template + "\n")
    done = run_renderer(chart=demo_chart)
    assert done.returncode == 1
    assert error in done.stderr
