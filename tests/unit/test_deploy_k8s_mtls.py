"""deploy/k8s, internal mutual TLS, rendered offline: every Deployment presents its own
certificate from cert-manager's csi-driver, naming its identity (core/callers.py) and the
DNS names its callers dial, signed by a CA Issuer the manifests ship (with the self-signed
bootstrap of its CA); workers and postprocess check the gateways' certificates by the name
they share; the Issuers and the Certificate pass cert-manager's CRD schemas (a vendored
subset, k8s/schemas/). Rendering and schema helpers: test_deploy_k8s.py.
"""

from __future__ import annotations

import copy
import re
from pathlib import PurePosixPath
from typing import Any

import jsonschema
import pytest
import yaml

from tests.unit.test_deploy_k8s import (
    K8S,
    RENDERS,
    app_of,
    container_env,
    crd_validator,
    in_namespace,
    of_kind,
    render_all,
)
from tiermesh.core import callers

Docs = list[dict[str, Any]]
Renders = dict[str, Docs]

CERT_MANAGER_SCHEMAS = (
    K8S / "schemas" / "cert-manager-issuer-v1.yaml",
    K8S / "schemas" / "cert-manager-certificate-v1.yaml",
)
CSI_DRIVER = "csi.cert-manager.io"
# Every volume attribute cert-manager's csi-driver reads (cert-manager/csi-driver,
# pkg/apis/v1alpha1/types.go): it ignores any other key, so a misspelt one fails here.
CSI_ATTRIBUTES = frozenset(
    f"{CSI_DRIVER}/{key}"
    for key in (
        "issuer-name", "issuer-kind", "issuer-group", "literal-subject", "common-name",
        "organizations", "organizationalunits", "countries", "provinces", "localities",
        "streetaddresses", "postalcodes", "serialnumber", "dns-names", "ip-sans", "uri-sans",
        "duration", "is-ca", "key-usages", "key-algorithm", "key-encoding", "key-size",
        "ca-file", "certificate-file", "privatekey-file", "fs-group", "renew-before",
        "reuse-private-key", "pkcs12-enable", "pkcs12-filename", "pkcs12-password",
    )
)  # fmt: skip
# Each internal TLS variable: the csi attribute that names its file, and the driver's default.
TLS_FILES = {
    "TIERMESH_INTERNAL_TLS_CA_FILE": ("ca-file", "ca.crt"),
    "TIERMESH_INTERNAL_TLS_CERT_FILE": ("certificate-file", "tls.crt"),
    "TIERMESH_INTERNAL_TLS_KEY_FILE": ("privatekey-file", "tls.key"),
}
# A service reads its certificate once, at start (core/tls.py); the driver's renewal is
# taken up at the pod's next start. So a certificate must outlast a long-running pod.
MIN_CERTIFICATE_HOURS = 90 * 24
# The addresses callers dial: variable -> (the Deployment it reaches, the gRPC service).
DIALS = {
    "TIERMESH_ROUTER_ADDRESS": ("router", "tiermesh.v1.Router"),
    "TIERMESH_POSTPROCESS_ADDRESS": ("postprocess", "tiermesh.v1.Postprocess"),
}
# The variable the Delivery clients (workers, postprocess) check gateways' certificates by.
DELIVERY_NAME = "TIERMESH_DELIVERY_TLS_SERVER_NAME"


def attr(attrs: dict[str, str], key: str, default: str = "") -> str:
    return attrs.get(f"{CSI_DRIVER}/{key}", default)


def names(attrs: dict[str, str], key: str) -> set[str]:
    """A comma-separated attribute (dns-names, uri-sans, key-usages) as a set."""
    return {n.strip() for n in attr(attrs, key).split(",") if n.strip()}


def hours(duration: str) -> float:
    """A Go duration of hours, minutes and seconds ("8760h", "90m")."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert match and duration, f"not a duration: {duration!r}"
    h, m, s = (int(g or 0) for g in match.groups())
    return h + m / 60 + s / 3600


def the_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def internal_tls(namespace: Docs, deployment: dict[str, Any]) -> dict[str, str]:
    """The volume attributes of the csi-driver volume the Deployment's three
    TIERMESH_INTERNAL_TLS_* files come from, checked: all three set, each in that one
    volume, mounted read-only, under the file name the attributes give it."""
    where = deployment["metadata"]["name"]
    pod = deployment["spec"]["template"]["spec"]
    container = the_container(deployment)
    env = container_env(namespace, container)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = {PurePosixPath(m["mountPath"]): m for m in container.get("volumeMounts", [])}
    sources = set()
    for var, (key, default) in TLS_FILES.items():
        assert var in env, f"{where}: no {var}"
        path = PurePosixPath(env[var])
        mount = mounts.get(path.parent)
        assert mount is not None, f"{where}: {var}={path} is in no mounted volume"
        assert mount.get("readOnly") is True, f"{where}: {mount['mountPath']} is writable"
        csi = volumes[mount["name"]].get("csi", {})
        assert csi.get("driver") == CSI_DRIVER, f"{where}: {var} is not from {CSI_DRIVER}"
        assert csi.get("readOnly") is True, f"{where}: the driver mounts read-only volumes only"
        assert path.name == attr(csi.get("volumeAttributes", {}), key, default), (where, var)
        sources.add(mount["name"])
    (source,) = sources
    return dict(volumes[source]["csi"]["volumeAttributes"])


def identity(attrs: dict[str, str]) -> str:
    """The one tiermesh identity the certificate's URI names carry."""
    (found,) = callers.identities_of(names(attrs, "uri-sans"))
    return found


def apps(docs: Docs) -> list[str]:
    """The app of each Deployment."""
    deployments = of_kind(docs, "Deployment").values()
    return [app_of(d["spec"]["template"]["metadata"]["labels"]) for d in deployments]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Renders:
    return render_all(tmp_path_factory)


@pytest.fixture(scope="module")
def cert_manager() -> dict[str, jsonschema.Draft7Validator]:
    """Kind -> its vendored CRD schema."""
    validators = {}
    for path in CERT_MANAGER_SCHEMAS:
        for kind in yaml.safe_load(path.read_text())["source"]["kinds"]:
            validators[kind] = crd_validator(path)
    return validators


@pytest.fixture(scope="module")
def key_usages() -> frozenset[str]:
    """cert-manager's key usages (the Certificate CRD's `usages`), which the csi-driver's
    key-usages takes too."""
    schema = yaml.safe_load(CERT_MANAGER_SCHEMAS[1].read_text())["openAPIV3Schema"]
    return frozenset(schema["properties"]["spec"]["properties"]["usages"]["items"]["enum"])


# ------------------------------------------------------------------- certificates


@pytest.mark.parametrize("render", RENDERS)
def test_every_service_presents_its_own_certificate(
    render: str, rendered: Renders, key_usages: frozenset[str]
) -> None:
    """Every Deployment (each serves gRPC) reads its internal CA, certificate and key from
    its own csi-driver volume, whose certificate names the identity of its app
    (spiffe://tiermesh/<app>) and nothing else of the mesh, serves as server and client,
    is readable by the pod's group (the files are 0440) and outlasts a long-running pod."""
    docs = rendered[render]
    namespace = in_namespace(rendered, render)
    deployments = of_kind(docs, "Deployment")
    assert deployments
    for name, deployment in deployments.items():
        attrs = internal_tls(namespace, deployment)
        assert set(attrs) <= CSI_ATTRIBUTES, f"{name}: {set(attrs) - CSI_ATTRIBUTES}"
        app = app_of(deployment["spec"]["template"]["metadata"]["labels"])
        assert app in callers.IDENTITIES, name
        assert names(attrs, "uri-sans") == {callers.identity_uri(app)}, name
        usages = names(attrs, "key-usages")
        assert usages <= key_usages, f"{name}: {usages - key_usages}"
        assert {"server auth", "client auth"} <= usages, name
        run_as = deployment["spec"]["template"]["spec"]["securityContext"]["runAsGroup"]
        assert attr(attrs, "fs-group") == str(run_as), name
        assert hours(attr(attrs, "duration")) >= MIN_CERTIFICATE_HOURS, name
        assert attr(attrs, "is-ca", "false") == "false", name


@pytest.mark.parametrize("render", RENDERS)
def test_every_certificate_comes_from_a_shipped_ca_issuer(render: str, rendered: Renders) -> None:
    """The Issuer each volume names is in the pod's namespace (the edge overlay uses
    center's): a CA Issuer (the csi-driver cannot use a self-signed one) whose CA Secret a
    shipped Certificate makes, isCA, signed by a self-signed Issuer, and outliving the
    certificates it signs."""
    namespace = in_namespace(rendered, render)
    issuers = of_kind(namespace, "Issuer")
    certificates = of_kind(namespace, "Certificate")
    for name, deployment in of_kind(rendered[render], "Deployment").items():
        attrs = internal_tls(namespace, deployment)
        assert attr(attrs, "issuer-kind", "Issuer") == "Issuer", name
        assert attr(attrs, "issuer-group", "cert-manager.io") == "cert-manager.io", name
        issuer = issuers.get(attr(attrs, "issuer-name"))
        assert issuer is not None, f"{render}: {name} names no shipped Issuer"
        assert issuer["metadata"]["namespace"] == deployment["metadata"]["namespace"], name
        secret = issuer["spec"]["ca"]["secretName"]
        (ca,) = [c for c in certificates.values() if c["spec"]["secretName"] == secret]
        assert ca["spec"]["isCA"] is True
        ref = ca["spec"]["issuerRef"]
        assert ref.get("kind", "Issuer") == "Issuer"
        assert issuers[ref["name"]]["spec"] == {"selfSigned": {}}
        assert hours(ca["spec"]["duration"]) > hours(attr(attrs, "duration"))


@pytest.mark.parametrize("render", RENDERS)
def test_callers_dial_names_the_servers_certificates_carry(render: str, rendered: Renders) -> None:
    """The gateway dials the router, workers dial postprocess, by a Service name (the
    address's host) that leads to those pods and that their certificate carries; and the
    caller's certificate names an identity that service takes calls from."""
    docs = rendered[render]
    namespace = in_namespace(rendered, render)
    servers = of_kind(namespace, "Deployment")
    services = of_kind(namespace, "Service")
    dialled = set()
    for name, deployment in of_kind(docs, "Deployment").items():
        env = container_env(namespace, the_container(deployment))
        caller = identity(internal_tls(namespace, deployment))
        for var, (server, service) in DIALS.items():
            if var not in env:
                continue
            host = env[var].rpartition(":")[0]
            attrs = internal_tls(namespace, servers[server])
            assert host in names(attrs, "dns-names"), f"{name} dials {host}: not in {server}'s"
            selector = services[host.split(".")[0]]["spec"]["selector"].items()
            assert selector <= servers[server]["spec"]["template"]["metadata"]["labels"].items()
            assert caller in callers.CALLERS[service], f"{service} refuses {caller} ({name})"
            dialled.add(var)
    expected = {"TIERMESH_ROUTER_ADDRESS"} if "gateway" in apps(docs) else set()
    expected |= {"TIERMESH_POSTPROCESS_ADDRESS"} if "worker" in apps(docs) else set()
    assert dialled == expected, render


@pytest.mark.parametrize("render", RENDERS)
def test_delivery_checks_gateways_by_the_name_their_certificates_share(
    render: str, rendered: Renders
) -> None:
    """Each gateway advertises its pod IP for Delivery, which no certificate made before the
    pod runs can name: every Delivery caller (workers, postprocess) sets
    TIERMESH_DELIVERY_TLS_SERVER_NAME to a DNS name of the gateways' certificate, and its
    own certificate names an identity Delivery takes calls from."""
    docs = rendered[render]
    namespace = in_namespace(rendered, render)
    gateway = of_kind(namespace, "Deployment")["gateway"]
    gateway_names = names(internal_tls(namespace, gateway), "dns-names")
    advertised = container_env(namespace, the_container(gateway))["TIERMESH_DELIVERY_ADVERTISE"]
    assert advertised.startswith("$(TIERMESH_POD_IP):")
    delivering = callers.CALLERS["tiermesh.v1.Delivery"]
    seen = 0
    for name, deployment in of_kind(docs, "Deployment").items():
        env = container_env(namespace, the_container(deployment))
        if identity(internal_tls(namespace, deployment)) not in delivering:
            assert DELIVERY_NAME not in env, f"{name} sets {DELIVERY_NAME} and delivers nothing"
            continue
        assert env.get(DELIVERY_NAME) in gateway_names, f"{name}: {env.get(DELIVERY_NAME)!r}"
        seen += 1
    assert seen == sum(app in {"worker", "postprocess"} for app in apps(docs)) > 0, render


# ------------------------------------------------------------------ CRD schemas


def test_issuers_and_certificates_pass_cert_managers_crd_schemas(
    rendered: Renders, cert_manager: dict[str, jsonschema.Draft7Validator]
) -> None:
    seen = 0
    for render, docs in rendered.items():
        for doc in docs:
            if doc["apiVersion"].split("/")[0] != "cert-manager.io":
                continue
            assert doc["apiVersion"] == "cert-manager.io/v1", doc["apiVersion"]
            where = f"{render}: {doc['kind']}/{doc['metadata']['name']}"
            errors = [e.message for e in cert_manager[doc["kind"]].iter_errors(doc)]
            assert errors == [], f"{where}: {errors}"
            seen += 1
    # Two Issuers and the CA Certificate in every rendering with the mesh (not edge's).
    assert seen == 3 * (len(rendered) - 1)


def test_the_cert_manager_schema_check_rejects_broken_objects(
    rendered: Renders, cert_manager: dict[str, jsonschema.Draft7Validator]
) -> None:
    docs = rendered["dev"]
    good = {
        "Certificate": of_kind(docs, "Certificate")["tiermesh-internal-ca"],
        "Issuer": of_kind(docs, "Issuer")["tiermesh-internal-ca"],
    }
    for kind, breakage in (
        ("Certificate", "unknown field"),
        ("Certificate", "no secretName"),
        ("Certificate", "string isCA"),
        ("Certificate", "string key size"),
        ("Certificate", "unknown rotation policy"),
        ("Issuer", "CA without a Secret"),
        ("Issuer", "no spec"),
    ):
        assert cert_manager[kind].is_valid(good[kind]), kind
        bad = copy.deepcopy(good[kind])
        spec = bad["spec"]
        if breakage == "unknown field":
            spec["isCa"] = True
        elif breakage == "no secretName":
            del spec["secretName"]
        elif breakage == "string isCA":
            spec["isCA"] = "true"
        elif breakage == "string key size":
            spec["privateKey"]["size"] = "256"
        elif breakage == "unknown rotation policy":
            spec["privateKey"]["rotationPolicy"] = "Sometimes"
        elif breakage == "CA without a Secret":
            del spec["ca"]["secretName"]
        else:
            del bad["spec"]
        assert not cert_manager[kind].is_valid(bad), breakage
