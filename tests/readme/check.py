#!/usr/bin/env python3
"""Runs every shell command of README.md, the docs/ pages a user installs from, and CONTRIBUTING.md
as written, the way a new user would.

Usage: tests/readme/check.py            (from anywhere; CI runs it in .ci/run)

Each ```sh block of these files (DOCS) carries a marker on the line before it, which says where
its commands run; a block without one fails the check, so no command goes unchecked, and a page
of docs/ with a ```sh block that DOCS does not list fails it too. The files are checked in the
order of DOCS, README.md first (the install), docs/upgrade.md last but one (the uninstall),
against the same control planes; every message names the file and the line:

  <!-- check: local -->          on this machine, no cluster
  <!-- check: dev ARGS -->       with `gpu-share serve --dev ARGS` running (the block starts it)
  <!-- check: fresh -->          on a bare control plane (tests/cluster/up.sh with
                                 GPU_SHARE_CLUSTER_INSTALL=none): the install and uninstall steps
  <!-- check: helm -->           on another bare control plane: the Helm install, upgrade and
                                 uninstall (helm from tools/build.sh; no --wait: gpu-share's own
                                 pods cannot run here, there is no container runtime), and the
                                 monitoring values (that cluster has prometheus-operator's CRDs and
                                 a monitoring namespace)
  <!-- check: skip: REASON -->   not run here, and the reason says where it is checked instead

Both control planes run kube-controller-manager and KWOK for the kubelets, so workloads create
pods and bound pods run; but gpu-share's own pods do nothing (no container runtime), so the
webhook a user installs never answers there. Within a block, a command whose comment says
`needs gpu-share running` runs as written against a second control plane with gpu-share
installed and running as local processes (tests/cluster/up.sh), so the webhook and the extender
answer and the namespace exists; one whose comment says `needs cert-manager` (not here) runs there
with `--dry-run=server`: the API server admits it without persisting it, through every admission
step, against cert-manager's CRDs (from its Go module), installed there.

The commands run in a copy of the repository (only the files git knows; its `target/` is the
checkout's, so that a command that builds compiles the crate alone) beside a link to ../shared,
so nothing they write lands in the checkout. `kubectl` is the control plane's own (v1.37), `helm`
tools/build.sh's and `gpu-share` an optimized build (Cargo's profile `ci`, the simulator stage's,
so CI compiles it once), all first on PATH.
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The order matters: the README installs, the pages after it change what it installed, and
# docs/upgrade.md uninstalls.
DOCS = ("README.md", "docs/admission.md", "docs/install.md", "docs/dra.md", "docs/per-gpu.md", "docs/platforms.md",
        "docs/extender.md",
        "docs/configuration.md", "docs/simulate.md", "docs/upgrade.md", "docs/real-nodes.md",
        "CONTRIBUTING.md")
MUTATING = {"apply", "create", "run", "patch", "delete", "taint", "label", "annotate"}
CA_PLACEHOLDER = "<caBundle printed by gpu-share certs>"


class Failed(Exception):
    pass


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=isinstance(cmd, str), check=True, text=True,
                          capture_output=True, **kw)


def blocks(text):
    """(line, marker, [logical commands with their first line]) for every ```sh block."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```sh":
            start = i + 1
            marker = None
            if i > 0:
                m = re.match(r"<!-- check: (.*?) -->$", lines[i - 1].strip())
                marker = m.group(1) if m else None
            body = []
            i += 1
            while lines[i].strip() != "```":
                body.append((i + 1, lines[i]))
                i += 1
            cmds = []
            pending, first = "", None
            for n, l in body:
                if first is None:
                    first = n
                if l.rstrip().endswith("\\"):
                    pending += l.rstrip()[:-1] + " "
                    continue
                cmds.append((first, pending + l))
                pending, first = "", None
            out.append((start, marker, [(n, c) for n, c in cmds if c.strip() and not c.strip().startswith("#")]))
        i += 1
    return out


def comment_of(cmd):
    """The command and its trailing comment (a # outside quotes, after a space)."""
    quote = None
    for i, ch in enumerate(cmd):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or cmd[i - 1].isspace()):
            return cmd[:i].rstrip(), cmd[i + 1:].strip()
    return cmd, ""


def dry_run(cmd):
    """`cmd` with --dry-run=server after kubectl's verb's arguments (before a `--`)."""
    words = shlex.split(cmd)
    if words[0] != "kubectl" or not MUTATING & set(words):
        return None
    if "--" in words:
        k = words.index("--")
        words = words[:k] + ["--dry-run=server"] + words[k:]
    else:
        words.append("--dry-run=server")
    return shlex.join(words)


class Cluster:
    def __init__(self, work, name, install):
        self.dir = os.path.join(work, name)
        env = dict(os.environ, GPU_SHARE_BIN=os.path.join(REPO, "target/ci/gpu-share"))
        if not install:
            env["GPU_SHARE_CLUSTER_INSTALL"] = "none"
        print(f"readme check: starting the {name} control plane", flush=True)
        r = subprocess.run(["bash", os.path.join(REPO, "tests/cluster/up.sh"), self.dir], env=env,
                           text=True, capture_output=True)
        if r.returncode != 0:
            raise Failed(f"up.sh {name}: {r.stderr[-2000:]}")
        self.env = dict(l.split("=", 1) for l in open(os.path.join(self.dir, "env")).read().split("\n") if "=" in l)
        self.kubeconfig = self.env["KUBECONFIG"]

    def kubectl(self, *args, stdin=None):
        return subprocess.run([self.env["KUBECTL"], "--kubeconfig", self.kubeconfig, *args], input=stdin,
                              text=True, capture_output=True)

    def down(self):
        subprocess.run(["bash", os.path.join(REPO, "tests/cluster/down.sh"), self.dir], capture_output=True)


def cert_manager_crds():
    sys.path.insert(0, os.path.join(REPO, "tests/cluster"))
    import crds
    try:
        return crds.crds("cert-manager")
    except RuntimeError as e:
        raise Failed(str(e))


def wait_ready(url, proc, seconds=120):
    end = time.time() + seconds
    while time.time() < end:
        if proc.poll() is not None:
            raise Failed(f"the server exited ({proc.returncode}): {proc.stdout.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise Failed(f"{url} not ready within {seconds} s")


def main():
    found = []
    for doc in DOCS:
        text = open(os.path.join(REPO, doc)).read()
        found += [(doc, line, marker, cmds) for line, marker, cmds in blocks(text)]
    unlisted = [f"docs/{f}" for f in sorted(os.listdir(os.path.join(REPO, "docs")))
                if f.endswith(".md") and f"docs/{f}" not in DOCS
                and blocks(open(os.path.join(REPO, "docs", f)).read())]
    if unlisted:
        print(f"readme check: ```sh blocks in pages the check does not run: {', '.join(unlisted)}", file=sys.stderr)
        return 1
    unmarked = [f"{doc}:{line}" for doc, line, marker, _ in found if marker is None]
    if unmarked:
        print(f"readme check: ```sh blocks without a check marker at {', '.join(unmarked)}", file=sys.stderr)
        return 1

    work = tempfile.mkdtemp(prefix="gpu-share-readme-")
    checkout = os.path.join(work, "work", "main")
    os.makedirs(checkout)
    for f in sh(["git", "ls-files"], cwd=REPO).stdout.split("\n"):
        if f and os.path.isfile(os.path.join(REPO, f)):
            os.makedirs(os.path.dirname(os.path.join(checkout, f)), exist_ok=True)
            shutil.copy2(os.path.join(REPO, f), os.path.join(checkout, f))
    # The copy builds into the checkout's target directory: the dependencies compiled there are
    # the copy's too (only the crate itself is compiled again, from the copy's path), where a
    # target of its own would compile every dependency again, twice (a release build and a
    # test build), and cold in CI. The binaries the copy's commands build replace the
    # checkout's in target/ (the same sources; their revision reads "unknown", the copy having
    # no .git): they are removed at the end (below), and the checkout's next build links its own.
    os.symlink(os.path.join(REPO, "target"), os.path.join(checkout, "target"))
    shared = os.path.join(os.path.dirname(REPO), "shared")
    if os.path.isdir(shared):
        os.symlink(shared, os.path.join(work, "work", "shared"))

    # The binaries the copy's builds may replace in the shared target/ (the copy's crate is another
    # package to cargo, so the checkout's next build would not put its own back): removed after
    # the check when replaced, so that the checkout's next build links them again.
    binaries = [os.path.join(REPO, "target", d, "gpu-share") for d in ("debug", "ci", "release")]
    stamps = {b: os.stat(b).st_mtime_ns for b in binaries if os.path.exists(b)}
    before = sh(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO).stdout
    fresh = installed = bare_helm = None
    servers = []
    ran, dry, skipped, failures = 0, 0, [], []
    try:
        sh(["cargo", "build", "--profile", "ci", "--locked", "--quiet", "--bin", "gpu-share"], cwd=REPO)
        control_plane = sh(["bash", os.path.join(REPO, "tests/cluster/build.sh")]).stdout.strip()
        bindir = os.path.join(work, "bin")
        os.makedirs(bindir)
        os.symlink(os.path.join(control_plane, "kubectl"), os.path.join(bindir, "kubectl"))
        os.symlink(os.path.join(REPO, "target/ci/gpu-share"), os.path.join(bindir, "gpu-share"))
        tools = sh(["bash", os.path.join(REPO, "tools/build.sh")]).stdout.strip()
        os.symlink(os.path.join(tools, "helm"), os.path.join(bindir, "helm"))
        base_env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"])
        base_env.pop("KUBECONFIG", None)

        for doc, line, marker, cmds in found:
            mode, _, arg = marker.partition(" ")
            mode = mode.rstrip(":")
            if mode == "skip":
                skipped.append(f"{doc}:{line}: {len(cmds)} command(s) not run here: {arg}")
                continue
            # Placeholders a user fills in: NAME=VALUE words of the marker.
            subs = [w.split("=", 1) for w in shlex.split(arg) if "=" in w] if mode != "dev" else []
            env = dict(base_env)
            if mode == "fresh":
                if fresh is None:
                    fresh = Cluster(work, "fresh", install=False)
                env["KUBECONFIG"] = fresh.kubeconfig
            if mode == "helm":
                if bare_helm is None:
                    bare_helm = Cluster(work, "helm", install=False)
                    # What the monitoring block needs first: prometheus-operator's CRDs, and
                    # Prometheus's namespace.
                    sys.path.insert(0, os.path.join(REPO, "tests/cluster"))
                    import crds
                    applied = bare_helm.kubectl("apply", "--server-side", "-f", "-",
                                                stdin=crds.crds("prometheus-operator"))
                    if applied.returncode != 0:
                        raise Failed(f"prometheus-operator CRDs: {applied.stderr}")
                    bare_helm.kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
                                      "crd/servicemonitors.monitoring.coreos.com",
                                      "crd/prometheusrules.monitoring.coreos.com")
                    bare_helm.kubectl("create", "namespace", "monitoring")
                env["KUBECONFIG"] = bare_helm.kubeconfig
            if mode == "dev":
                args = ["gpu-share", "serve", "--dev", *shlex.split(arg)]
                proc = subprocess.Popen(args, cwd=checkout, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
                servers.append(proc)
                wait_ready("http://127.0.0.1:8080/readyz", proc)
            # One script per block, so variables carry from line to line; each command is
            # announced on stderr first, so a failure names its line.
            script = ["set -eo pipefail"]
            for n, cmd in cmds:
                cmd, comment = comment_of(cmd)
                for old, new in subs:
                    cmd = cmd.replace(old, new)
                if mode == "dev" and "serve --dev" in cmd:
                    script.append(f"echo {shlex.quote(f'{doc}:{n}: (started by the check) {cmd}')} >&2")
                    continue
                prefix = ""
                if comment.startswith(("needs gpu-share running", "needs cert-manager")):
                    d = dry_run(cmd) if comment.startswith("needs cert-manager") else cmd
                    if d is None:
                        skipped.append(f"{doc}:{n}: not run ({comment}): {cmd}")
                        continue
                    if installed is None:
                        installed = Cluster(work, "installed", install=True)
                        applied = installed.kubectl("apply", "--server-side", "-f", "-", stdin=cert_manager_crds())
                        if applied.returncode != 0:
                            raise Failed(f"cert-manager CRDs: {applied.stderr}")
                    words = shlex.split(cmd)
                    if "-n" in words:
                        installed.kubectl("create", "namespace", words[words.index("-n") + 1])
                    prefix = f"KUBECONFIG={shlex.quote(installed.kubeconfig)} "
                    if d != cmd:
                        dry += 1
                    cmd = d
                # The caBundle sits in a single-quoted JSON patch: close the quotes around it.
                cmd = cmd.replace(CA_PLACEHOLDER, "'\"$(base64 -w0 certs/out/ca.crt)\"'")
                script.append(f"echo {shlex.quote(f'{doc}:{n}: {prefix}{cmd}')} >&2")
                script.append(prefix + cmd)
                ran += 1
            r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=checkout, env=env, text=True,
                               capture_output=True, timeout=900)
            for l in r.stderr.split("\n"):
                if l.startswith(tuple(f"{d}:" for d in DOCS)):
                    print(f"readme check: {l}", flush=True)
            if r.returncode != 0:
                failures.append(f"block at {doc}:{line} exited {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
            for proc in servers:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            servers.clear()
        # The checkout is as it was: nothing the commands wrote landed in the repository.
        after = sh(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO).stdout
        if after != before:
            failures.append(f"the commands changed the checkout:\n{after}")
    except (Failed, subprocess.CalledProcessError) as e:
        failures.append(str(e) + (getattr(e, "stderr", "") or ""))
    finally:
        for proc in servers:
            os.killpg(proc.pid, signal.SIGTERM)
        for c in (fresh, installed, bare_helm):
            if c:
                c.down()
        shutil.rmtree(work, ignore_errors=True)
        replaced = [b for b in binaries if os.path.exists(b) and os.stat(b).st_mtime_ns != stamps.get(b)]
        for b in replaced:
            os.remove(b)
        # The copy's crate has the checkout's metadata hash, so its build also left its objects
        # and fingerprints where the checkout's were: a newer build.rs makes the checkout's next
        # build run it again (its git revision) and link the binary anew.
        if replaced:
            os.utime(os.path.join(REPO, "build.rs"))
    for s in skipped:
        print(f"readme check: {s}")
    print(f"readme check: {ran} commands run ({dry} with --dry-run=server), {len(skipped)} skipped with a reason, "
          f"{len(failures)} failed")
    for f in failures:
        print(f"readme check: FAILED {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
