"""deploy/k8s: every overlay builds, validates against the Kubernetes schemas (offline, from the
kubernetes-validate package), and agrees with the server's configuration."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from common import flags
from server.app import SERVICE_NAME
from server.config import MIB, ServerConfig
from tests.deploy.conftest import (
    OVERLAY_NAMES,
    OVERLAYS,
    SCHEDULER_STOP_SECONDS,
    container,
    find,
    mib,
    pod_spec,
    server_environment,
)

# Native gRPC probes are GA since 1.27; the newest schemas the package ships catch removals.
KUBERNETES_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
CRD_KINDS = {"ServiceMonitor"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed: compared only where it is")
@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_minimal_builder_matches_kubectl_kustomize(overlays, overlay):
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS / overlay)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    key = lambda m: (m["kind"], m["metadata"]["name"])
    assert sorted(yaml.safe_load_all(rendered), key=key) == sorted(overlays[overlay], key=key)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_manifests_validate_against_the_kubernetes_schemas(overlays, overlay, version):
    kinds = sorted(m["kind"] for m in overlays[overlay])
    assert kinds == sorted(
        [
            "Namespace",
            "ConfigMap",
            "Deployment",
            "Service",
            "Service",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "ServiceMonitor",
        ]
    )
    for manifest in overlays[overlay]:
        if manifest["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(manifest, version, strict=True)


def test_strict_validation_catches_a_misspelled_field(overlays):
    deployment = copy.deepcopy(find(overlays["cpu"], "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {"port": 50051}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_service_monitor_scrapes_the_metrics_port_once(overlays, overlay):
    """The CRD's required fields by hand: selector and endpoints, matching the metrics Service."""
    manifests = overlays[overlay]
    monitor = find(manifests, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == find(manifests, "Deployment")["metadata"]["namespace"]
    wanted = monitor["spec"]["selector"]["matchLabels"]
    selected = [m for m in manifests if m["kind"] == "Service" and wanted.items() <= m["metadata"]["labels"].items()]
    ports = [{p["name"] for p in service["spec"]["ports"]} for service in selected]
    for endpoint in monitor["spec"]["endpoints"]:
        assert sum(endpoint["port"] in names for names in ports) == 1, "exactly one Service exposes the scraped port"
        assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_selectors_select_the_pods(overlays, overlay):
    manifests = overlays[overlay]
    deployment = find(manifests, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selectors = [
        deployment["spec"]["selector"]["matchLabels"],
        find(manifests, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        find(manifests, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
    ]
    selectors += [s["spec"]["selector"] for s in manifests if s["kind"] == "Service"]
    for selector in selectors:
        assert selector.items() <= pod_labels.items()
    target = find(manifests, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_probes_use_the_grpc_health_service(overlays, overlay):
    """Natively over plaintext; with TLS on (the tls overlay) through the image's health check, which
    speaks TLS (tests/server/operations/test_tls.py runs it against TLS servers) and reads the server's settings."""
    main = container(overlays[overlay])
    config = server_environment(overlays[overlay])
    services = {"startupProbe": SERVICE_NAME, "readinessProbe": SERVICE_NAME, "livenessProbe": ""}
    for probe, service in services.items():
        if config.tls_cert is None:
            assert main[probe]["grpc"] == {"port": config.port, "service": service}
        else:
            assert main[probe]["exec"]["command"] == ["python", "/app/healthcheck.py", service]
    if config.tls_cert is not None:
        mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
        assert str(config.tls_cert.parent) in mounts and str(config.tls_key.parent) in mounts
        (ca,) = [e["value"] for e in main["env"] if e["name"] == "TRANSLATE_HEALTHCHECK_CA"]
        assert Path(ca).parent == config.tls_cert.parent


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_config_map_is_a_valid_server_config(overlays, overlay):
    data = find(overlays[overlay], "ConfigMap", "translator-config")["data"]
    fields = {"TRANSLATE_" + name.upper() for name in flags.names(ServerConfig)}
    assert set(data) <= fields, f"not server settings: {sorted(set(data) - fields)}"
    config = server_environment(overlays[overlay])
    cpu = container(overlays[overlay])["resources"]["requests"]["cpu"]
    assert config.engine.intra_op_threads == int(cpu), "ONNX Runtime threads match the CPU request"


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_drain_fits_in_the_termination_grace_period(overlays, overlay):
    """preStop sleep, then SIGTERM: drain for grace_seconds, then stop the scheduler; all before SIGKILL."""
    sleep = container(overlays[overlay])["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    grace = server_environment(overlays[overlay]).grace_seconds
    assert int(sleep[1]) + grace + SCHEDULER_STOP_SECONDS < pod_spec(overlays[overlay])["terminationGracePeriodSeconds"]
    liveness = container(overlays[overlay])["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > grace, "liveness outlasts the drain"


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_memory_covers_the_budget(overlays, overlay):
    resources = container(overlays[overlay])["resources"]
    budget_mib = server_environment(overlays[overlay]).memory_budget_bytes // MIB
    assert mib(resources["requests"]["memory"]) >= 2 * budget_mib, "budget plus model and runtime"
    assert mib(resources["limits"]["memory"]) > mib(resources["requests"]["memory"])


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_pods_run_as_non_root_on_a_read_only_root(overlays, overlay, dockerfile_stages):
    pod, main = pod_spec(overlays[overlay]), container(overlays[overlay])
    assert pod["securityContext"]["runAsNonRoot"] is True
    (user,) = dockerfile_stages["runtime"].all("USER")
    assert user.value == (f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}",)
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    tmp = next(m for m in main["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_network_policy_opens_grpc_to_the_cluster_and_metrics_to_monitoring(overlays, overlay):
    config = server_environment(overlays[overlay])
    rules = {
        rule["ports"][0]["port"]: rule["from"] for rule in find(overlays[overlay], "NetworkPolicy")["spec"]["ingress"]
    }
    assert rules[config.port] == [{"namespaceSelector": {}}]
    assert rules[config.metrics_port] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_headless_service_for_client_side_round_robin(overlays, overlay):
    headless = find(overlays[overlay], "Service", "translator-headless")
    assert headless["spec"]["clusterIP"] == "None"
    assert [p["name"] for p in headless["spec"]["ports"]] == ["grpc"]


def test_gpu_overlay_runs_fp16_on_one_gpu(overlays):
    gpu, cpu = overlays["gpu"], overlays["cpu"]
    assert container(gpu)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container(cpu)["resources"]["limits"]
    assert pod_spec(gpu)["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod_spec(gpu)["tolerations"]
    config = server_environment(gpu)
    assert (config.engine.provider, config.engine.variant) == ("cuda", "fp16")
    assert container(gpu)["image"].endswith("-cuda") and not container(cpu)["image"].endswith("-cuda")


def test_the_keys_overlay_mounts_the_file_the_server_reads(overlays):
    manifests = overlays["keys"]
    config = server_environment(manifests)
    mounts = {m["mountPath"]: m for m in container(manifests)["volumeMounts"]}
    mount = mounts[str(config.api_keys.parent)]
    volume = next(v for v in pod_spec(manifests)["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] and volume["secret"]["secretName"] == "translator-api-keys"
    assert config.redis_url.startswith("redis://") and server_environment(overlays["cpu"]).api_keys is None
