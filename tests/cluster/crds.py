#!/usr/bin/env python3
"""The CustomResourceDefinitions gpu-share's optional objects need, from the projects' Go modules
(the Go module proxy is the one source allowed here): cert-manager's (Certificate, Issuer) and
prometheus-operator's (ServiceMonitor, PrometheusRule).

Usage: python3 tests/cluster/crds.py cert-manager|prometheus-operator ...   (YAML on stdout)
Used by .ci/check-chart and tests/readme/check.py to dry-run those objects against a real API
server.
"""
import os
import re
import subprocess
import sys
import tempfile

MODULES = {
    # module@version, the directory of CRD files in it, the files (None: every .yaml there)
    "cert-manager": ("github.com/cert-manager/cert-manager@v1.16.2", "deploy/crds", None),
    "prometheus-operator": ("github.com/prometheus-operator/prometheus-operator@v0.85.0",
                            "example/prometheus-operator-crd",
                            ["monitoring.coreos.com_servicemonitors.yaml",
                             "monitoring.coreos.com_prometheusrules.yaml"]),
}


def crds(name):
    module, sub, files = MODULES[name]
    r = subprocess.run(["go", "mod", "download", "-json", module], text=True, capture_output=True,
                       cwd=tempfile.gettempdir(), env=dict(os.environ, GOFLAGS="-mod=mod", GO111MODULE="on"))
    if r.returncode != 0:
        raise RuntimeError(f"go mod download {module}: {r.stderr}")
    d = os.path.join(re.search(r'"Dir": "([^"]+)"', r.stdout).group(1), sub)
    docs = []
    for f in files or sorted(f for f in os.listdir(d) if f.endswith(".yaml")):
        # cert-manager's files carry its Helm chart's templates in comments and quoted labels.
        docs.append(re.sub(r"'\{\{[^']*\}\}'", "cert-manager", open(os.path.join(d, f)).read()))
    return "\n---\n".join(docs)


if __name__ == "__main__":
    print("\n---\n".join(crds(n) for n in sys.argv[1:]))
