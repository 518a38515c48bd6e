#!/usr/bin/env python3
"""Validate the Kubernetes manifests of a fleet (deploy/kubernetes).

Every object is checked against the schemas of Kubernetes KUBE_VERSION with
kubernetes-validate in strict mode (an unknown field is an error), and a
SpinApp against deploy/schemas/spinapp-v1alpha1.schema.json (SpinKube's kind,
which kubernetes-validate does not know). kustomization.yaml must list every
manifest and generated file in the folder, and nothing that is missing.

    python3 scripts/validate-deploy.py [DIR]      (default deploy/kubernetes)

Exit status 0 when everything is valid; else each problem on stderr.
"""

import json
import pathlib
import sys

import jsonschema
import kubernetes_validate
import yaml

KUBE_VERSION = "1.33.0"
ROOT = pathlib.Path(__file__).resolve().parent.parent
SPINAPP_SCHEMA = ROOT / "deploy" / "schemas" / "spinapp-v1alpha1.schema.json"


def main() -> int:
    folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "deploy" / "kubernetes")
    spinapp = jsonschema.Draft202012Validator(json.loads(SPINAPP_SCHEMA.read_text()))
    problems = []
    kinds = []
    manifests = sorted(p for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
    for path in manifests:
        try:
            documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as e:
            problems.append(f"{path.name}: not YAML: {e}")
            continue
        for doc in documents:
            kind = doc.get("kind", "?") if isinstance(doc, dict) else "?"
            where = f"{path.name}: {kind} {doc.get('metadata', {}).get('name', '?') if isinstance(doc, dict) else ''}"
            kinds.append(kind)
            if kind == "SpinApp":
                for error in spinapp.iter_errors(doc):
                    location = "/".join(str(p) for p in error.absolute_path) or "(top)"
                    problems.append(f"{where}: {location}: {error.message}")
                continue
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                location = "/".join(str(p) for p in e.path) or "(top)"
                problems.append(f"{where}: {location}: {e.message}")
            except Exception as e:  # no schema for the kind, or a broken document
                problems.append(f"{where}: {e}")
    kustomization = folder / "kustomization.yaml"
    if kustomization.exists():
        k = yaml.safe_load(kustomization.read_text()) or {}
        listed = set(k.get("resources", []))
        for generator in k.get("configMapGenerator", []):
            for f in generator.get("files", []):
                listed.add(f.split("=", 1)[-1])
        for name in sorted(listed):
            if not (folder / name).exists():
                problems.append(f"kustomization.yaml: lists {name}, which does not exist")
        for path in manifests:
            if path.name not in listed:
                problems.append(f"kustomization.yaml: does not list {path.name}")
    else:
        problems.append("kustomization.yaml is missing")
    if problems:
        for p in problems:
            print(p, file=sys.stderr)
        return 1
    print(f"ok: {len(kinds)} objects valid for Kubernetes {KUBE_VERSION} ({', '.join(kinds)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
