#!/usr/bin/env bash
# Validates the Kubernetes manifests in deploy/k8s/ offline: every document of every *.yaml file
# against the JSON schemas of a pinned Kubernetes version, strict (unknown fields are errors), with
# kubernetes-validate (PyPI), then the checks an API server or a running cluster would make and a
# schema cannot: selectors that match their pod templates, mounts of declared volumes, references to
# ConfigMaps, Secrets, keys and claims defined here, $(VAR) references to variables defined before,
# named ports, one namespace, duplicate YAML keys; and Sonic's own: the catalog ConfigMap equals
# deploy/catalog.yaml (the catalog.yaml beside DIR), and the agent DaemonSets (one per VM type) are
# the same but for their VM type, whose vCPUs, memory and network match the catalog.
#
#   bash deploy/validate-k8s.sh [DIR]     # DIR: deploy/k8s by default
#
# Installs kubernetes-validate into the repo's .venv (made with `python3 -m venv` when missing; the
# same venv deploy/seaweedfs.sh uses). Exit status: 0 all valid, 1 an error (each one names its file),
# 2 bad usage or the validator could not be installed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
KV_VERSION="1.37.0"  # kubernetes-validate; ships schemas for Kubernetes 1.32 to 1.37
K8S_VERSION="1.34.0" # the Kubernetes version the manifests are checked against

log() { echo "validate-k8s: $*" >&2; }

case "${1:-}" in
-h | --help)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
    exit 0
    ;;
esac
(($# <= 1)) || { log "usage: bash deploy/validate-k8s.sh [DIR]"; exit 2; }
DIR="${1:-$ROOT/deploy/k8s}"
[[ -d "$DIR" ]] || { log "no folder $DIR"; exit 2; }

if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    python3 -m venv "$VENV" || { log "python3 -m venv failed: install python3-venv (apt-get install python3-venv)"; exit 2; }
fi
installed="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("kubernetes-validate"))' 2>/dev/null || true)"
if [[ "$installed" != "$KV_VERSION" ]]; then
    log "installing kubernetes-validate $KV_VERSION into $VENV"
    "$VENV/bin/pip" install --disable-pip-version-check -q "kubernetes-validate==$KV_VERSION" ||
        { log "pip install kubernetes-validate==$KV_VERSION failed"; exit 2; }
fi

exec "$VENV/bin/python" - "$DIR" "$K8S_VERSION" <<'PY'
import copy
import os
import re
import sys

import yaml
from kubernetes_validate import utils as kv

directory, k8s_version = sys.argv[1:3]
# The catalog the ConfigMap copies: catalog.yaml beside the folder (deploy/catalog.yaml for deploy/k8s).
catalog_path = os.path.join(os.path.dirname(os.path.abspath(directory)), "catalog.yaml")
errors = []


def error(path, message):
    errors.append(f"ERROR {os.path.relpath(path)}: {message}")


class UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping (kubectl refuses it too)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


files = sorted(os.path.join(directory, f) for f in os.listdir(directory)
               if f.endswith((".yaml", ".yml")))
if not files:
    print(f"ERROR {directory}: no YAML file", file=sys.stderr)
    sys.exit(1)

CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole",
                  "ClusterRoleBinding", "PriorityClass", "CustomResourceDefinition"}
objects = []        # (file, doc) of the Kubernetes objects
valid = set()       # id() of the objects that passed the schema: the checks below read only those
kustomizations = []  # (file, doc)
for path in files:
    try:
        with open(path) as f:
            docs = [d for d in yaml.load_all(f, Loader=UniqueKeyLoader) if d is not None]
    except yaml.YAMLError as e:
        error(path, f"not valid YAML: {e}")
        continue
    if not docs:
        error(path, "no YAML document")
    for i, doc in enumerate(docs, 1):
        where = f"document {i}"
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            error(path, f"{where}: not a Kubernetes object (needs apiVersion and kind)")
            continue
        if doc["kind"] == "Kustomization":
            kustomizations.append((path, doc))
            continue
        name = (doc.get("metadata") or {}).get("name")
        if not name:
            error(path, f"{where} ({doc['kind']}): metadata.name is missing")
            continue
        try:
            kv.validate(doc, k8s_version, strict=True)
            valid.add(id(doc))
        except kv.ValidationError as e:
            field = ".".join(str(p) for p in e.path) or "(top)"
            error(path, f"{doc['kind']}/{name} is not valid for Kubernetes {e.version}: {field}: {e.message}")
        except kv.SchemaNotFoundError as e:
            error(path, f"{doc['kind']}/{name}: unknown kind or apiVersion ({e.message})")
        except kv.VersionNotSupportedError as e:
            print(f"FATAL {e.message}", file=sys.stderr)
            sys.exit(2)
        except Exception as e:  # a shape the schema code cannot even walk
            error(path, f"{doc['kind']}/{name} could not be validated: {e!r}")
        objects.append((path, doc))


# --- checks across objects -----------------------------------------------------------------------
def consistency_checks(all_objects):
    # Names are taken from every object (a reference to an invalid one is not a second error); the
    # checks read only the objects that passed the schema, whose shapes they can trust.
    everything = all_objects
    objects = [(p, d) for p, d in everything if id(d) in valid]

    def key(kind, name):
        return f"{kind}/{name}"

    by_kind = {}
    for path, doc in everything:
        k = key(doc["kind"], doc["metadata"]["name"])
        if k in by_kind:
            error(path, f"{k} is also defined in {os.path.relpath(by_kind[k][0])}")
        by_kind[k] = (path, doc)

    namespaces = [d["metadata"]["name"] for _, d in objects if d["kind"] == "Namespace"]
    for path, doc in objects:
        if doc["kind"] in CLUSTER_SCOPED:
            continue
        ns = doc["metadata"].get("namespace")
        if not ns:
            error(path, f"{doc['kind']}/{doc['metadata']['name']}: metadata.namespace is missing")
        elif namespaces and ns not in namespaces:
            error(path, f"{doc['kind']}/{doc['metadata']['name']}: namespace {ns!r} is not defined here ({', '.join(namespaces)})")

    def data_keys(doc):
        return set((doc.get("data") or {}).keys()) | set((doc.get("stringData") or {}).keys()) \
            | set((doc.get("binaryData") or {}).keys())

    def check_ref(path, owner, kind, name, keys=(), optional=False):
        if optional:
            return
        target = by_kind.get(key(kind, name))
        if target is None:
            error(path, f"{owner}: refers to {kind} {name!r}, which no file here defines")
            return
        missing = [k for k in keys if k not in data_keys(target[1])]
        if missing:
            error(path, f"{owner}: refers to key(s) {', '.join(missing)} of {kind} {name!r}, "
                        f"which has only {', '.join(sorted(data_keys(target[1]))) or 'no keys'}")

    WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}
    pod_templates = []  # (path, owner, template)
    for path, doc in objects:
        if doc["kind"] not in WORKLOADS:
            continue
        owner = f"{doc['kind']}/{doc['metadata']['name']}"
        spec = doc.get("spec") or {}
        template = spec.get("template") or {}
        labels = (template.get("metadata") or {}).get("labels") or {}
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        if doc["kind"] != "Job":
            if not selector:
                error(path, f"{owner}: spec.selector.matchLabels is empty")
            for k, v in selector.items():
                if labels.get(k) != v:
                    error(path, f"{owner}: selector {k}={v} does not match the pod template's labels")
        pod_templates.append((path, owner, template))

    for path, owner, template in pod_templates:
        pod = template.get("spec") or {}
        volumes = {}
        for v in pod.get("volumes") or []:
            if v["name"] in volumes:
                error(path, f"{owner}: volume {v['name']!r} is declared twice")
            volumes[v["name"]] = v
            if "configMap" in v:
                cm = v["configMap"]
                check_ref(path, f"{owner} volume {v['name']}", "ConfigMap", cm.get("name"),
                          [i["key"] for i in cm.get("items") or []], cm.get("optional", False))
            if "secret" in v:
                s = v["secret"]
                check_ref(path, f"{owner} volume {v['name']}", "Secret", s.get("secretName"),
                          [i["key"] for i in s.get("items") or []], s.get("optional", False))
            if "persistentVolumeClaim" in v:
                check_ref(path, f"{owner} volume {v['name']}", "PersistentVolumeClaim",
                          v["persistentVolumeClaim"]["claimName"])
        used = set()
        for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            cname = f"{owner} container {c['name']}"
            ports = {p.get("name") for p in c.get("ports") or [] if p.get("name")}
            for m in c.get("volumeMounts") or []:
                used.add(m["name"])
                if m["name"] not in volumes:
                    error(path, f"{cname}: mounts volume {m['name']!r}, which the pod does not declare")
            defined = set()
            for e in c.get("env") or []:
                if e["name"] in defined:
                    error(path, f"{cname}: variable {e['name']} is set twice")
                for ref in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", e.get("value") or ""):
                    if ref not in defined:
                        error(path, f"{cname}: {e['name']} uses $({ref}), which is not set before it "
                                    "(Kubernetes would leave it unexpanded)")
                defined.add(e["name"])
                src = e.get("valueFrom") or {}
                if "secretKeyRef" in src:
                    r = src["secretKeyRef"]
                    check_ref(path, f"{cname} {e['name']}", "Secret", r["name"], [r["key"]],
                              r.get("optional", False))
                if "configMapKeyRef" in src:
                    r = src["configMapKeyRef"]
                    check_ref(path, f"{cname} {e['name']}", "ConfigMap", r["name"], [r["key"]],
                              r.get("optional", False))
            for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
                probe = c.get(probe_name) or {}
                for handler in ("httpGet", "tcpSocket", "grpc"):
                    port = (probe.get(handler) or {}).get("port")
                    if isinstance(port, str) and port not in ports:
                        error(path, f"{cname}: {probe_name} uses port {port!r}, which the container does not name")
        for name in volumes.keys() - used:
            error(path, f"{owner}: volume {name!r} is declared but mounted by no container")

    for path, doc in objects:
        if doc["kind"] != "Service":
            continue
        owner = f"Service/{doc['metadata']['name']}"
        selector = (doc.get("spec") or {}).get("selector") or {}
        matches = [t for _, _, t in pod_templates
                   if selector and all(((t.get("metadata") or {}).get("labels") or {}).get(k) == v
                                       for k, v in selector.items())]
        if not matches:
            error(path, f"{owner}: its selector {selector} matches no pod template here")
        for p in doc["spec"].get("ports") or []:
            target = p.get("targetPort")
            if isinstance(target, str) and not any(
                    target == cp.get("name") for t in matches
                    for c in (t.get("spec") or {}).get("containers") or [] for cp in c.get("ports") or []):
                error(path, f"{owner}: targetPort {target!r} is not a port name of the pods it selects")

    # --- kustomization ---------------------------------------------------------------------------
    for path, doc in kustomizations:
        for r in doc.get("resources") or []:
            target = os.path.join(os.path.dirname(path), r)
            if not os.path.exists(target):
                error(path, f"resource {r!r} does not exist")

    # --- Sonic: the catalog and the agent DaemonSets ------------------------------------------------
    catalog = None
    for path, doc in objects:
        text = (doc.get("data") or {}).get("catalog.yaml") if doc["kind"] == "ConfigMap" else None
        if text is None:
            continue
        try:
            catalog = yaml.safe_load(text)
        except yaml.YAMLError as e:
            error(path, f"ConfigMap/{doc['metadata']['name']}: catalog.yaml is not valid YAML: {e}")
            continue
        if os.path.exists(catalog_path):
            with open(catalog_path) as f:
                if f.read() != text:
                    error(path, f"ConfigMap/{doc['metadata']['name']}: catalog.yaml differs from "
                                f"{os.path.relpath(catalog_path)}: copy it again (indented 4 spaces)")

    VM_FIELDS = {"SONIC_AGENT_VM_TYPE": None, "SONIC_AGENT_VCPUS": "vcpus",
                 "SONIC_AGENT_MEMORY_MB": "memory_mb", "SONIC_AGENT_NETWORK_MBPS": "network_mbps"}
    LABEL = "sonic.dev/vm-type"
    shapes = {}  # normalized DaemonSet -> (path, name)
    types = {}
    for path, doc in objects:
        if doc["kind"] != "DaemonSet":
            continue
        containers = doc["spec"]["template"]["spec"].get("containers") or []
        env = {e["name"]: e.get("value") for c in containers for e in c.get("env") or []}
        if "SONIC_AGENT_VM_TYPE" not in env:
            continue
        owner = f"DaemonSet/{doc['metadata']['name']}"
        vm = env["SONIC_AGENT_VM_TYPE"]
        selector = doc["spec"]["template"]["spec"].get("nodeSelector") or {}
        if selector.get(LABEL) != vm:
            error(path, f"{owner}: nodeSelector {LABEL}={selector.get(LABEL)!r} but SONIC_AGENT_VM_TYPE={vm!r}")
        if vm in types:
            error(path, f"{owner}: VM type {vm} already has {types[vm]}")
        types[vm] = owner
        if catalog is not None:
            entry = next((t for t in catalog.get("vm_types") or [] if t.get("name") == vm), None)
            if entry is None:
                error(path, f"{owner}: VM type {vm!r} is not in the catalog")
            else:
                for var, field in VM_FIELDS.items():
                    if field and str(entry.get(field)) != str(env.get(var)):
                        error(path, f"{owner}: {var}={env.get(var)!r} but the catalog says {field}: {entry.get(field)}")
        # The same DaemonSet but for the VM type: blank the type-specific values and compare.
        shape = copy.deepcopy(doc)
        shape["metadata"]["name"] = "-"
        for labels in (shape["metadata"].get("labels") or {}, shape["spec"]["selector"].get("matchLabels") or {},
                       shape["spec"]["template"]["metadata"].get("labels") or {},
                       shape["spec"]["template"]["spec"].get("nodeSelector") or {}):
            if LABEL in labels:
                labels[LABEL] = "-"
        for c in shape["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env") or []:
                if e["name"] in VM_FIELDS:
                    e["value"] = "-"
        shape = yaml.safe_dump(shape, sort_keys=True)
        if shapes and shape not in shapes:
            first = next(iter(shapes.values()))
            error(path, f"{owner} differs from {first[1]} ({os.path.relpath(first[0])}) in more than its VM type: "
                        "keep the agent DaemonSets the same shape")
        shapes.setdefault(shape, (path, owner))



try:
    consistency_checks(objects)
except Exception as e:  # a shape these checks did not expect: say so, never a traceback
    errors.append(f"ERROR {directory}: the consistency checks could not run: {e!r}")

# --- report --------------------------------------------------------------------------------------
for path in files:
    n = sum(1 for p, _ in objects if p == path) + sum(1 for p, _ in kustomizations if p == path)
    bad = any(e.startswith(f"ERROR {os.path.relpath(path)}:") for e in errors)
    print(f"{'FAIL' if bad else 'ok  '} {os.path.relpath(path)}: {n} document(s)")
for e in errors:
    print(e, file=sys.stderr)
if errors:
    print(f"validate-k8s: {len(errors)} error(s) in {directory}", file=sys.stderr)
    sys.exit(1)
print(f"validate-k8s: {len(objects)} objects in {len(files)} files valid for Kubernetes {k8s_version} "
      f"(strict schemas) and consistent")
PY
