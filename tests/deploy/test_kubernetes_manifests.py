"""deploy/kubernetes/ (docs/SCALE_OUT.md): every document parses and names a resource kind that
exists, the pieces name each other consistently, and omni-serve's args parse with its own parser.

Nothing here talks to a cluster: these are the checks that can fail without one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from omni.cli.options import parse_args, server_config
from omni.http.app import _OPEN_PATHS, add_routes
from omni.shared.store.spec import StoreSpec

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
NAMESPACE = "omni-serve"

# (apiVersion, kind) pairs that exist, and where each was looked up.
KNOWN_KINDS: dict[tuple[str, str], str] = {
    # Core Kubernetes, the API reference of any supported release
    # (https://kubernetes.io/docs/reference/kubernetes-api/).
    ("v1", "Namespace"): "kubernetes.io API reference, cluster resources",
    ("v1", "ConfigMap"): "kubernetes.io API reference, config and storage resources",
    ("v1", "Secret"): "kubernetes.io API reference, config and storage resources",
    ("v1", "PersistentVolumeClaim"): "kubernetes.io API reference, config and storage resources",
    ("v1", "Service"): "kubernetes.io API reference, service resources",
    ("v1", "ServiceAccount"): "kubernetes.io API reference, authentication resources",
    ("apps/v1", "Deployment"): "kubernetes.io API reference, workload resources",
    ("apps/v1", "StatefulSet"): "kubernetes.io API reference, workload resources",
    ("policy/v1", "PodDisruptionBudget"): "kubernetes.io API reference, policy resources (GA in 1.21)",
    ("rbac.authorization.k8s.io/v1", "Role"): "kubernetes.io API reference, authorization resources",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "kubernetes.io API reference, authorization resources",
    # Gateway API, standard channel (https://gateway-api.sigs.k8s.io/reference/spec/).
    ("gateway.networking.k8s.io/v1", "GatewayClass"): "Gateway API v1 standard channel",
    ("gateway.networking.k8s.io/v1", "Gateway"): "Gateway API v1 standard channel",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "Gateway API v1 standard channel",
    # The Gateway API inference extension: kubernetes-sigs/gateway-api-inference-extension v1.6.0,
    # api/v1/inferencepool_types.go and apix/v1alpha1/inferencepoolimport_types.go
    # (https://gateway-api-inference-extension.sigs.k8s.io/reference/spec/).
    ("inference.networking.k8s.io/v1", "InferencePool"): "gateway-api-inference-extension api/v1",
    ("inference.networking.x-k8s.io/v1alpha1", "InferencePoolImport"): "gateway-api-inference-extension apix/v1alpha1",
    # InferenceObjective and InferenceModelRewrite left the extension (its PR #2973, June 2026) for
    # llm-d/llm-d-router v0.10.0, apix/v1alpha2 (+groupName=llm-d.ai) and
    # config/crd/bases/llm-d.ai_inferenceobjectives.yaml.
    ("llm-d.ai/v1alpha2", "InferenceObjective"): "llm-d-router apix/v1alpha2",
    ("llm-d.ai/v1alpha2", "InferenceModelRewrite"): "llm-d-router apix/v1alpha2",
    # Istio networking, v1 since Istio 1.22 (https://istio.io/latest/blog/2024/v1-apis/).
    ("networking.istio.io/v1", "DestinationRule"): "Istio networking v1",
}
CLUSTER_SCOPED = {"Namespace", "GatewayClass"}

# InferencePoolSpec's fields, and those of its parts (api/v1/inferencepool_types.go, v1.6.0).
POOL_SPEC_FIELDS = {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
POOL_EPP_REF_FIELDS = {"group", "kind", "name", "port", "failureMode"}

# EndpointPickerConfig plugin types of llm-d/llm-d-router v0.10.0 (each file's *Type constant).
_PLUGINS = "pkg/epp/framework/plugins/"
EPP_PLUGIN_TYPES: dict[str, str] = {
    "queue-scorer": _PLUGINS + "scheduling/scorer/queuedepth/queue.go",
    "kv-cache-utilization-scorer": _PLUGINS + "scheduling/scorer/kvcacheutilization/kvcache_utilization.go",
    "prefix-cache-scorer": _PLUGINS + "scheduling/scorer/prefix/plugin.go",
    "approx-prefix-cache-producer": _PLUGINS + "requestcontrol/dataproducer/approximateprefix/constants/constants.go",
    "max-score-picker": _PLUGINS + "scheduling/picker/maxscore/picker.go",
    "single-profile-handler": _PLUGINS + "scheduling/profilehandler/single/single_profile_handler.go",
    "metrics-data-source": _PLUGINS + "datalayer/source/metrics/datasource.go",
    "core-metrics-extractor": _PLUGINS + "datalayer/extractor/metrics/factories.go",
}
# The parameters each of them decodes (the json tags of its config struct, same release; the
# scorers without one ignore parameters).
EPP_PLUGIN_PARAMETERS: dict[str, set[str]] = {
    "metrics-data-source": {
        "scheme", "path", "port", "insecureSkipVerify", "caCertPath", "clientCertPath", "clientKeyPath", "interval",
    },
    "core-metrics-extractor": {"engineLabelKey", "defaultEngine", "engineConfigs"},
    "approx-prefix-cache-producer": {
        "autoTune", "blockSizeTokens", "blockSize", "maxPrefixBlocksToMatch", "maxPrefixTokensToMatch",
        "lruCapacityPerServer",
    },
    "prefix-cache-scorer": {"prefixMatchInfoProducerName", "matchLengthWeight", "matchLengthScaleTokens"},
    "max-score-picker": {"maxNumOfEndpoints"},
}
# The config's group (apix/config/v1alpha1/doc.go: +groupName=llm-d.ai).
EPP_CONFIG_API_VERSION = "llm-d.ai/v1alpha1"

_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class _StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys without a word; the API server refuses such a
    manifest (strict field validation), so the tests refuse it first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        twice = {k for k in keys if keys.count(k) > 1}
        if twice:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate keys {twice}", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _load_all(text: str) -> list[Any]:
    return list(yaml.load_all(text, Loader=_StrictLoader))  # a SafeLoader: plain data only


def _documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in _load_all(path.read_text()):
            if doc is not None:
                yield path.name, doc


DOCS = list(_documents())


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for _, d in DOCS if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"want one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return container


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _model_server() -> dict[str, Any]:
    return _one("Deployment", "omni-serve")


def _epp() -> dict[str, Any]:
    return _one("Deployment", "omni-serve-epp")


def _env_value(entry: dict[str, Any]) -> str:
    """An env entry's value, following a configMapKeyRef to the ConfigMap in the manifests."""
    if "value" in entry:
        return str(entry["value"])
    ref = entry["valueFrom"]["configMapKeyRef"]
    return str(_one("ConfigMap", ref["name"])["data"][ref["key"]])


def _expanded_args(container: dict[str, Any]) -> list[str]:
    """The container's args as the kubelet passes them: $(VAR) replaced from the env entries
    whose value the manifests give (a literal or a ConfigMap key; Secrets hold placeholders, and
    no arg names one)."""
    values = {
        e["name"]: _env_value(e)
        for e in container.get("env", [])
        if "value" in e or "configMapKeyRef" in e.get("valueFrom", {})
    }

    def expand(arg: str) -> str:
        def one(m: re.Match[str]) -> str:
            assert m.group(1) in values, f"arg {arg!r} names ${m.group(1)}, which no env entry gives"
            return values[m.group(1)]

        return _VAR.sub(one, arg)

    return [expand(str(a)) for a in container["args"]]


def test_every_document_names_a_real_kind_in_one_namespace() -> None:
    assert {name for name, _ in DOCS} >= {
        "00-namespace.yaml",
        "20-omni-serve.yaml",
        "30-inferencepool.yaml",
        "40-epp.yaml",
        "50-gateway.yaml",
    }
    seen = set()
    for name, doc in DOCS:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), name
        key = (doc["apiVersion"], doc["kind"])
        assert key in KNOWN_KINDS, f"{name}: {key} is no kind we know of"
        assert doc["metadata"].get("name"), f"{name}: a {doc['kind']} without metadata.name"
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in doc["metadata"], name
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{name}: {doc['kind']} outside {NAMESPACE}"
        ident = (doc["kind"], doc["metadata"]["name"])
        assert ident not in seen, f"{name}: {ident} twice"
        seen.add(ident)
    assert _one("Namespace")["metadata"]["name"] == NAMESPACE


def test_workload_selectors_match_their_pod_templates() -> None:
    deployments = [d for _, d in DOCS if d["kind"] == "Deployment"]
    for d in deployments:
        assert _selects(d["spec"]["selector"]["matchLabels"], _pod_labels(d)), d["metadata"]["name"]
    for _, doc in DOCS:
        if doc["kind"] in ("Service", "PodDisruptionBudget"):
            selector = doc["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            matched = [d["metadata"]["name"] for d in deployments if _selects(selector, _pod_labels(d))]
            assert len(matched) == 1, f"{doc['kind']} {doc['metadata']['name']} selects {matched}"


def test_the_route_sends_v1_to_the_inference_pool() -> None:
    route, pool, gateway = _one("HTTPRoute"), _one("InferencePool"), _one("Gateway")
    (parent,) = route["spec"]["parentRefs"]
    assert (parent["group"], parent["kind"], parent["name"]) == (
        "gateway.networking.k8s.io",
        "Gateway",
        gateway["metadata"]["name"],
    )
    assert parent["sectionName"] in {listener["name"] for listener in gateway["spec"]["listeners"]}
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    (backend,) = rule["backendRefs"]
    assert backend == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": pool["metadata"]["name"],
    }


def test_the_pool_selects_the_model_server_pods_on_their_port() -> None:
    pool, server = _one("InferencePool"), _model_server()
    spec = pool["spec"]
    assert spec.keys() <= POOL_SPEC_FIELDS and {"selector", "targetPorts"} <= spec.keys()
    assert spec["selector"].keys() == {"matchLabels"}  # the v1 selector has nothing else
    assert _selects(spec["selector"]["matchLabels"], _pod_labels(server))
    assert not _selects(spec["selector"]["matchLabels"], _pod_labels(_epp()))
    container = _container(server, "omni-serve")
    container_ports = {p["containerPort"] for p in container["ports"]}
    target_ports = [p["number"] for p in spec["targetPorts"]]
    assert target_ports and set(target_ports) <= container_ports
    assert target_ports == [int(_flag(container["args"], "--port"))]


def test_the_endpoint_picker_reference_names_the_epp_service() -> None:
    pool, epp = _one("InferencePool"), _epp()
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.keys() <= POOL_EPP_REF_FIELDS
    assert ref.get("group", "") == "" and ref.get("kind", "Service") == "Service"
    assert ref.get("failureMode", "FailClose") in ("FailOpen", "FailClose")
    service = _one("Service", ref["name"])
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert _selects(service["spec"]["selector"], _pod_labels(epp))
    container = _container(epp, "epp")
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == int(_flag(container["args"], "--grpc-port"))
    args = container["args"]
    assert _flag(args, "--pool-name") == pool["metadata"]["name"]
    assert _flag(args, "--pool-namespace") == pool["metadata"]["namespace"]
    assert _flag(args, "--pool-group") == "inference.networking.k8s.io"
    # Istio reaches the picker by its Service's cluster name.
    host = _one("DestinationRule")["spec"]["host"]
    assert host == f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    # The picker's ServiceAccount may watch what it needs: the pool and its pods.
    account = epp["spec"]["template"]["spec"]["serviceAccountName"]
    _one("ServiceAccount", account)
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    (binding,) = [d for _, d in DOCS if d["kind"] == "RoleBinding" and subject in d["subjects"]]
    rules = _one(binding["roleRef"]["kind"], binding["roleRef"]["name"])["rules"]
    readable = {
        (group, resource)
        for rule in rules
        if "watch" in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= readable


def test_the_epp_config_has_the_scorers_and_a_max_score_picker() -> None:
    epp = _epp()
    container = _container(epp, "epp")
    config_file = Path(_flag(container["args"], "--config-file"))
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == config_file.parent]
    (volume,) = [v for v in epp["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    (config,) = _load_all(_one("ConfigMap", volume["configMap"]["name"])["data"][config_file.name])
    assert (config["apiVersion"], config["kind"]) == (EPP_CONFIG_API_VERSION, "EndpointPickerConfig")
    names = {}
    for plugin in config["plugins"]:
        assert plugin["type"] in EPP_PLUGIN_TYPES, f"unknown EPP plugin type {plugin['type']!r}"
        unknown = plugin.get("parameters", {}).keys() - EPP_PLUGIN_PARAMETERS.get(plugin["type"], set())
        assert not unknown, f"{plugin['type']} has no parameters {unknown}"
        names[plugin.get("name", plugin["type"])] = plugin["type"]  # the name defaults to the type
    refs = [p["pluginRef"] for profile in config["schedulingProfiles"] for p in profile["plugins"]]
    for source in config["dataLayer"]["sources"]:
        refs += [source["pluginRef"], *(e["pluginRef"] for e in source["extractors"])]
    assert set(refs) <= names.keys(), f"references to undeclared plugins: {set(refs) - names.keys()}"
    (profile,) = config["schedulingProfiles"]
    in_profile = {names[p["pluginRef"]]: p.get("weight") for p in profile["plugins"]}
    scorers = ("queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer")
    assert in_profile.keys() >= {*scorers, "max-score-picker"}
    assert all(in_profile[s] > 0 for s in scorers)


def test_env_references_resolve_to_the_manifests() -> None:
    for d in (_model_server(), _epp()):
        for container in d["spec"]["template"]["spec"]["containers"]:
            for entry in container.get("env", []):
                source = entry.get("valueFrom", {})
                for kind, ref_key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                    ref = source.get(ref_key)
                    if ref is None or ref.get("optional"):
                        continue
                    obj = _one(kind, ref["name"])
                    assert ref["key"] in {**obj.get("data", {}), **obj.get("stringData", {})}, entry["name"]


def test_probes_ask_omni_serve_routes_that_need_no_api_key() -> None:
    container = _container(_model_server(), "omni-serve")
    app = web.Application()
    add_routes(app)
    get_paths = {r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource is not None}
    port_names = {p["name"] for p in container["ports"]}
    probes = {kind: container[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/health" and probes["livenessProbe"]["path"] == "/ping"
    for probe in probes.values():
        # The kubelet sends no bearer key: a probe of a path behind --api-key would always fail.
        assert probe["path"] in get_paths and probe["path"] in _OPEN_PATHS, probe
        assert probe["port"] in port_names
    # The endpoint picker scrapes /metrics without a key too.
    assert "/metrics" in get_paths and "/metrics" in _OPEN_PATHS


def test_omni_serve_args_parse_with_its_own_parser() -> None:
    container = _container(_model_server(), "omni-serve")
    args = parse_args(_expanded_args(container))
    assert args.host == "0.0.0.0"  # the gateway connects to the pod's IP, not to loopback
    assert args.port == container["ports"][0]["containerPort"]
    store_settings = _one("ConfigMap", "omni-serve-store")["data"]
    spec = StoreSpec.parse(args.store)
    assert spec.backend == "s3", "pods share encoder outputs only through an S3 store"
    assert args.store == store_settings["OMNI_STORE"]
    assert args.store_endpoint_url == store_settings["OMNI_STORE_ENDPOINT_URL"]
    assert args.store_region == store_settings["OMNI_STORE_REGION"]
    ((_, model_dir),) = [m.partition("=")[::2] for m in args.model]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert any(Path(model_dir).is_relative_to(m) for m in mounts), f"{model_dir} is on no volume"


@pytest.fixture
def omni_layout(tmp_path: Path) -> Path:
    """An omni checkpoint's directory layout, config files only: flags become a config without
    reading weights, so this is all server_config looks at (and no torch is imported)."""
    for part in ("llm", "vision_encoder", "image_tokenizer", "vision_decoder"):
        (tmp_path / "omni" / part).mkdir(parents=True)
        (tmp_path / "omni" / part / "config.json").write_text("{}")
    return tmp_path / "omni"


def test_omni_serve_args_make_a_config_that_fits_the_pod(omni_layout: Path) -> None:
    """The args, with the volume's checkpoint swapped for a local layout, are a valid server
    config, and its timeouts fit inside what the pod spec allows them."""
    server = _model_server()
    container = _container(server, "omni-serve")
    argv = _expanded_args(container)
    model = argv.index("--model") + 1
    name = argv[model].partition("=")[0]
    argv[model] = f"{name}={omni_layout}"
    config = server_config(parse_args(argv))
    (engine,) = config.models
    assert engine.name == name and engine.encoder_dir == omni_layout.resolve()
    assert engine.llm.device == "cuda:0" and engine.worker.dtype == "bfloat16"
    # One model, one LLM worker, one GPU: the picker reads one series of each vllm: gauge per pod
    # (the first), so a pod with more workers would show it only part of its load.
    assert engine.llm.num_workers == 1
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert engine.store.location == config.store.location == _one("ConfigMap", "omni-serve-store")["data"]["OMNI_STORE"]
    # Loading may take --worker-start-timeout: the startup probe must wait at least that long,
    # and liveness must outlast a worker's restart, which is given as long.
    startup, liveness = container["startupProbe"], container["livenessProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] > engine.worker.worker_start_timeout
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > engine.worker.worker_start_timeout
    # SIGTERM's drain (preStop, then --shutdown-timeout) ends before the kubelet's SIGKILL.
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop + config.shutdown_timeout < server["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
