#!/usr/bin/env python3
"""The gitops tier's checks: the seed's story through the real GitOps engines. confighash is
installed as the quick start says on the real-node tier; the examples (their containers replaced
by the app image, as tier.py does) are committed to a git repository served inside the tier's
network namespace (scripts/node/git-server.py), and Flux, then Argo CD, sync them from it. Run by
scripts/gitops-tier.sh inside the namespace; every wait polls with a deadline.

Each engine runs as processes here, under a ServiceAccount of its own, so the audit log tells its
writes from confighash's. Counts: rollouts from revisions, confighash's and the engine's writes
from the audit log (dry-runs left out), the engines' own statuses read with kubectl.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tier  # noqa: E402  (the real-node tier's helpers)
from tier import (  # noqa: E402
    BARRIER_NS, Failed, audit_offset, barrier, check, kj, kubectl, log, pods, read_in, revision, rolled_out,
    selector_of, stamp, wait, writes_since,
)

GITOPS = os.environ["GITOPS_BIN"]
STATE = os.path.join(tier.STATE, "gitops")
GIT_SERVER = os.environ["GITOPS_GIT_SERVER"]
GIT_PORT = 8418
# The seed's hand-bumped annotation, in git on litellm's pod template until the migration.
HAND_BUMP = {"config-checksum": "v17-2b1c9e"}
CYCLES = 5

processes = []


def git(*args, cwd):
    p = subprocess.run(["git", "-c", "user.name=tier", "-c", "user.email=tier@confighash.invalid", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise Failed(f"git {' '.join(args[:3])} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    return p.stdout


def start(name, args, env=None):
    """Starts a process inside the namespace, its output in STATE/logs/NAME.log."""
    os.makedirs(os.path.join(STATE, "logs"), exist_ok=True)
    with open(os.path.join(STATE, "logs", name + ".log"), "ab") as out:
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True)
    processes.append((name, p))
    return p


def stop(keep=()):
    """Stops the processes started here, except those named in `keep`."""
    stopping = [(n, p) for n, p in processes if n not in keep]
    for name, p in stopping:
        if p.poll() is None:
            p.terminate()
    for name, p in stopping:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    processes[:] = [(n, p) for n, p in processes if n in keep]


def alive():
    dead = [(n, p.returncode) for n, p in processes if p.poll() is not None]
    check(not dead, f"engine processes ended: {dead} (see {STATE}/logs)")


# --- the repository ---
class Repo:
    """A bare repository served by the git server, and a working copy the checks commit in."""

    def __init__(self, name):
        self.name = name
        self.bare = os.path.join(STATE, "git", name + ".git")
        self.work = os.path.join(STATE, "work", name)
        self.url = f"http://127.0.0.1:{GIT_PORT}/{name}.git"
        os.makedirs(os.path.dirname(self.bare), exist_ok=True)
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", self.bare], check=True)
        subprocess.run(["git", "clone", "-q", self.bare, self.work], check=True, capture_output=True)
        os.makedirs(os.path.join(self.work, "apps"), exist_ok=True)

    def write(self, app, objects):
        """apps/APP.yaml: one JSON document per object (JSON is YAML)."""
        with open(os.path.join(self.work, "apps", app + ".yaml"), "w") as f:
            f.write("".join("---\n" + json.dumps(o, indent=1, sort_keys=True) + "\n" for o in objects))

    def remove(self, app):
        os.remove(os.path.join(self.work, "apps", app + ".yaml"))

    def commit(self, message):
        git("add", "-A", cwd=self.work)
        git("commit", "-q", "-m", message, cwd=self.work)
        git("push", "-q", "origin", "main", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work).strip()


def examples():
    """The examples as tier.py applies them, litellm's pod template with the seed's hand bump."""
    apps = {}
    for name in tier.WORKLOADS:
        objects = tier.example_objects(name)
        for o in objects:
            o.get("metadata", {}).pop("creationTimestamp", None)
            if o["kind"] == "Deployment" and o["metadata"]["name"] == "litellm":
                o["spec"]["template"]["metadata"].setdefault("annotations", {}).update(HAND_BUMP)
        apps[name] = objects
    return apps


def find(objects, kind, name):
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


# --- identities: each engine a ServiceAccount of its own, bound to cluster-admin ---
def service_account_kubeconfig(ns, name):
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": f"{ns}-{name}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
    ]}))
    token = kubectl("-n", ns, "create", "token", name, "--duration=24h").strip()
    admin = kj("config", "view", "--raw")
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": "tier", "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "tier", "user": name, "namespace": ns}}],
    }
    path = os.path.join(STATE, f"{ns}-{name}.kubeconfig")
    with open(path, "w") as f:
        json.dump(config, f)
    os.chmod(path, 0o600)
    return path, f"system:serviceaccount:{ns}:{name}"


def established(*crds):
    for crd in crds:
        wait(f"CRD {crd} established", lambda: any(
            c["type"] == "Established" and c["status"] == "True" for c in (kj("get", "crd", crd).get("status") or {}).get("conditions") or []), 60)


def engine_writes(engine, offset, resources=None):
    """The engine's writes to what it syncs: its Events and its own objects (in its namespace) left
    out."""
    writes = writes_since(offset, user=engine.user, verbs=("create", "update", "patch", "delete"), resources=resources)
    return [w for w in writes if w[1] != "events" and w[0] != engine.ns]


def workload_writes(offset):
    """confighash's writes outside the barrier's namespace."""
    return [w for w in writes_since(offset) if w[0] != BARRIER_NS]


# --- Flux ---
class Flux:
    name = "flux"
    ns = "flux-system"

    def __init__(self, repo):
        self.repo = repo

    def start(self):
        kubectl("apply", "--server-side", "-f", os.path.join(GITOPS, "crds", "flux"))
        established("gitrepositories.source.toolkit.fluxcd.io", "kustomizations.kustomize.toolkit.fluxcd.io")
        source_kubeconfig, _ = service_account_kubeconfig(self.ns, "source-controller")
        kustomize_kubeconfig, self.user = service_account_kubeconfig(self.ns, "kustomize-controller")
        storage = os.path.join(STATE, "flux-storage")
        os.makedirs(storage, exist_ok=True)
        env = {"RUNTIME_NAMESPACE": self.ns, "TMPDIR": storage}
        start("source-controller", [
            os.path.join(GITOPS, "source-controller"), "--storage-path", storage,
            "--storage-addr", "127.0.0.1:9790", "--storage-adv-addr", "127.0.0.1:9790", "--metrics-addr", "127.0.0.1:9791",
            "--health-addr", "127.0.0.1:9792", "--enable-leader-election=false", "--log-level", "info",
        ], {**env, "KUBECONFIG": source_kubeconfig})
        start("kustomize-controller", [
            os.path.join(GITOPS, "kustomize-controller"), "--metrics-addr", "127.0.0.1:9793",
            "--health-addr", "127.0.0.1:9794", "--enable-leader-election=false", "--log-level", "info",
        ], {**env, "KUBECONFIG": kustomize_kubeconfig})
        for port in (9792, 9794):
            wait(f"flux's controller on :{port} healthy", lambda: tier.run("curl", "-sf", f"http://127.0.0.1:{port}/readyz", check=False).returncode == 0, 60)

    def create(self):
        source = {
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "metadata": {"name": "examples", "namespace": self.ns},
            "spec": {"url": self.repo.url, "ref": {"branch": "main"}, "interval": "10m"},
        }
        app = {
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization", "metadata": {"name": "examples", "namespace": self.ns},
            # Drift is corrected on every reconcile: kustomize-controller applies server-side and
            # restores any field it manages that differs from git.
            "spec": {"interval": "10m", "path": "./apps", "prune": True, "sourceRef": {"kind": "GitRepository", "name": "examples"}, "timeout": "3m"},
        }
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [source, app]}))

    def refresh(self):
        """Asks both controllers to reconcile now, as `flux reconcile kustomization --with-source`
        does; returns the request's mark."""
        mark = f"{time.time():.6f}"
        for kind in ("gitrepository", "kustomization"):
            kubectl("-n", self.ns, "annotate", kind, "examples", f"reconcile.fluxcd.io/requestedAt={mark}", "--overwrite")
        return mark

    def pushed(self):
        """What Flux's notification-controller does on a git push: the source reconciles now, and
        the Kustomization follows the new artifact."""
        kubectl("-n", self.ns, "annotate", "gitrepository", "examples", f"reconcile.fluxcd.io/requestedAt={time.time():.6f}", "--overwrite")

    def reconciled(self, mark):
        return all(kj("-n", self.ns, "get", kind, "examples").get("status", {}).get("lastHandledReconcileAt") == mark for kind in ("gitrepository", "kustomization"))

    def synced_at(self, sha):
        k = kj("-n", self.ns, "get", "kustomization", "examples")
        s = k.get("status", {})
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in s.get("conditions", []))
        return ready and s.get("lastAppliedRevision", "").endswith(sha) and s.get("observedGeneration") == k["metadata"]["generation"]

    def applied(self, sha):
        return self.synced_at(sha)

    def status(self):
        s = kj("-n", self.ns, "get", "kustomization", "examples").get("status", {})
        ready = next((c for c in s.get("conditions", []) if c["type"] == "Ready"), {})
        return f"Ready={ready.get('status')} ({ready.get('reason')}) at {s.get('lastAppliedRevision')}"

    def out_of_sync(self):
        return not any(c["type"] == "Ready" and c["status"] == "True" for c in kj("-n", self.ns, "get", "kustomization", "examples").get("status", {}).get("conditions", []))

    def syncs(self):
        """Flux keeps no sync history; its writes are counted from the audit log instead."""
        return 0

    def delete(self):
        kubectl("-n", self.ns, "delete", "kustomization", "examples", "--wait=true", "--timeout=180s")
        kubectl("-n", self.ns, "delete", "gitrepository", "examples", "--wait=true", "--timeout=60s")


# --- Argo CD ---
class ArgoCD:
    name = "argo-cd"
    ns = "argocd"
    COMPARE = "ServerSideDiff=true"

    def __init__(self, repo):
        self.repo = repo

    def start(self):
        kubectl("apply", "--server-side", "-f", os.path.join(GITOPS, "crds", "argo-cd"))
        established("applications.argoproj.io", "appprojects.argoproj.io")
        kubeconfig, self.user = service_account_kubeconfig(self.ns, "argocd-application-controller")
        secret_key = base64.b64encode(os.urandom(32)).decode()
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "argocd-cm", "namespace": self.ns, "labels": {"app.kubernetes.io/part-of": "argocd"}}, "data": {}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "argocd-rbac-cm", "namespace": self.ns, "labels": {"app.kubernetes.io/part-of": "argocd"}}, "data": {}},
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "argocd-secret", "namespace": self.ns, "labels": {"app.kubernetes.io/part-of": "argocd"}}, "stringData": {"server.secretkey": secret_key}},
            {"apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject", "metadata": {"name": "default", "namespace": self.ns},
             "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}], "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]}},
        ]}))
        work = os.path.join(STATE, "argo-cd")
        os.makedirs(os.path.join(work, "tmp"), exist_ok=True)
        env = {
            "KUBECONFIG": kubeconfig, "ARGOCD_FAKE_IN_CLUSTER": "true", "ARGOCD_GPG_ENABLED": "false", "HOME": work,
            "TMPDIR": os.path.join(work, "tmp"), "PATH": os.path.join(GITOPS, "bin") + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
        }
        start("redis", ["redis-server", "--bind", "127.0.0.1", "--port", "6379", "--save", "", "--appendonly", "no", "--protected-mode", "yes"])
        wait("redis", lambda: tier.run("redis-cli", "-p", "6379", "ping", check=False).stdout.strip() == "PONG", 30)
        start("argocd-repo-server", [
            os.path.join(GITOPS, "argocd-repo-server"), "--address", "127.0.0.1", "--port", "8081", "--metrics-address", "127.0.0.1",
            "--metrics-port", "8084", "--disable-tls", "--client-ca-path", "", "--redis", "127.0.0.1:6379", "--loglevel", "info",
        ], env)
        start("argocd-application-controller", [
            os.path.join(GITOPS, "argocd-application-controller"), "--kubeconfig", kubeconfig, "--namespace", self.ns,
            "--repo-server", "127.0.0.1:8081", "--repo-server-plaintext", "--redis", "127.0.0.1:6379",
            "--metrics-port", "8082", "--loglevel", "info", "--status-processors", "4", "--operation-processors", "2",
        ], env)
        wait("argocd-repo-server", lambda: tier.run("curl", "-sf", "http://127.0.0.1:8084/metrics", "-o", "/dev/null", check=False).returncode == 0, 60)

    def create(self):
        app = {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "examples", "namespace": self.ns, "finalizers": ["resources-finalizer.argocd.argoproj.io"],
                         "annotations": {"argocd.argoproj.io/compare-options": self.COMPARE}},
            "spec": {
                "project": "default",
                "source": {"repoURL": self.repo.url, "targetRevision": "main", "path": "apps"},
                "destination": {"server": "https://kubernetes.default.svc"},
                "syncPolicy": {"automated": {"prune": True, "selfHeal": True}},
            },
        }
        kubectl("apply", "-f", "-", input=json.dumps(app))

    def set_compare(self, compare):
        kubectl("-n", self.ns, "annotate", "application", "examples", f"argocd.argoproj.io/compare-options={compare}", "--overwrite")

    def refresh(self):
        """A normal refresh, as argocd-server does when a git webhook reaches it. The controller
        removes the annotation once the refreshed status is stored."""
        kubectl("-n", self.ns, "annotate", "application", "examples", "argocd.argoproj.io/refresh=normal", "--overwrite")

    def pushed(self):
        self.refresh()

    def reconciled(self, _mark):
        return "argocd.argoproj.io/refresh" not in self.app()["metadata"].get("annotations", {})

    def app(self):
        return kj("-n", self.ns, "get", "application", "examples")

    def synced_at(self, sha):
        """Compared with the commit, Synced and Healthy, and no sync operation running or failed
        (a commit whose diff is empty starts none)."""
        s = self.app().get("status", {})
        op = s.get("operationState", {})
        return (
            s.get("sync", {}).get("status") == "Synced" and s.get("sync", {}).get("revision") == sha
            # A suspended CronJob (backstage's, as tier.py applies it) would make it Suspended.
            and s.get("health", {}).get("status") in ("Healthy", "Suspended") and op.get("phase") in (None, "Succeeded")
        )

    def applied(self, sha):
        op = self.app().get("status", {}).get("operationState", {})
        return op.get("phase") == "Succeeded" and op.get("syncResult", {}).get("revision") == sha

    def status(self):
        s = self.app().get("status", {})
        return f"{s.get('sync', {}).get('status')}/{s.get('health', {}).get('status')} at {s.get('sync', {}).get('revision', '')[:12]}, last operation {s.get('operationState', {}).get('phase')}"

    def out_of_sync(self):
        return self.app().get("status", {}).get("sync", {}).get("status") != "Synced"

    def syncs(self):
        """The id of the last sync operation (the history keeps the last ten)."""
        return max((h.get("id", 0) for h in self.app().get("status", {}).get("history", [])), default=0)

    def delete(self):
        kubectl("-n", self.ns, "delete", "application", "examples", "--wait=true", "--timeout=180s")


# --- the flow ---
def wait_synced(engine, sha, what, timeout=180):
    def done():
        alive()
        return engine.synced_at(sha)

    try:
        wait(f"{engine.name} synced at {sha[:12]} ({what})", done, timeout, 0.5)
    except Failed as e:
        raise Failed(f"{e}; {engine.name}: {engine.status()}") from None


def push(engine, repo, message):
    """Commits and tells the engine, as a git webhook would."""
    sha = repo.commit(message)
    engine.pushed()
    return sha


def cycles(engine, sha, what):
    """CYCLES reconciles after a sync: each reports the commit synced, none writes anything, no
    sync is started, nothing rolls."""
    before, offset, syncs = tier.snapshot(), audit_offset(), engine.syncs()
    for i in range(CYCLES):
        mark = engine.refresh()
        wait(f"{engine.name}'s reconcile {i + 1} of {CYCLES}", lambda: engine.reconciled(mark), 120, 0.5)
        check(engine.synced_at(sha), f"{what}: {engine.name} is not synced at {sha[:12]} after reconcile {i + 1}: {engine.status()}")
    writes = engine_writes(engine, offset)
    check(not writes, f"{what}: {engine.name} wrote in {CYCLES} reconciles after the sync: {writes[:10]}")
    check(engine.syncs() == syncs, f"{what}: {engine.name} synced {engine.syncs() - syncs} more times")
    tier.assert_nothing_rolled(before, offset, f"{what}: {CYCLES} reconciles")
    log(f"{engine.name}, {what}: {CYCLES} reconciles, each synced at the commit, no write, nothing rolled")


def a_commit(engine, repo, apps, what, edit, rolls, confighash_writes, syncs=1, refresh_in_window=False):
    """Commits an edit; checks that exactly `rolls` rolled, once each, and that confighash wrote
    `confighash_writes`; returns the sha and the times measured: to the first new revision, to
    synced and rolled out, and how long the engine showed its app not synced after it had applied
    the commit (the transient drift a diff that includes the webhook's mutation shows). With
    `refresh_in_window`, a refresh is requested whenever none is pending from the moment the
    engine has applied the commit until the rollouts start, as a user pressing Refresh would;
    `syncs` None measures the sync operations instead of asserting them."""
    before, offset, syncs_before = tier.snapshot(), audit_offset(), engine.syncs()
    edit(apps)
    for app in apps:
        repo.write(app, apps[app])
    started = time.monotonic()
    sha = push(engine, repo, what)
    first = None
    drifted = out_total = 0.0
    last = time.monotonic()
    while True:
        # The engine's view, sampled through the change window until it is synced at the commit.
        now = time.monotonic()
        if first is None and all(revision(ns, kind, name) > before[(ns, kind, name)] for ns, kind, name in rolls):
            first = now - started
        applied = engine.applied(sha)
        if refresh_in_window and applied and first is None and engine.reconciled(None):
            engine.refresh()
        out = engine.out_of_sync()
        if out:
            out_total += now - last
        if applied and out:
            drifted += now - last
        last = now
        if first is not None and not out and engine.synced_at(sha) and all(rolled_out(ns, kind, name) for ns, kind, name in rolls):
            break
        alive()
        check(now - started < 240, f"{what}: not synced and rolled out in 240 s: {engine.status()}")
        time.sleep(0.25)
    complete = time.monotonic() - started
    barrier()
    after = tier.snapshot()
    moved = {k: after[k] - before[k] for k in before if after[k] != before[k]}
    check(moved == {r: 1 for r in rolls}, f"{what}: rolled {moved}, not once each of {rolls}")
    writes = workload_writes(offset)
    check(writes == confighash_writes, f"{what}: confighash's writes were {writes}, not {confighash_writes}")
    engine_wrote = engine_writes(engine, offset)
    synced = engine.syncs() - syncs_before
    log(f"{engine.name}, {what}: rolled {sorted(k[2] for k in moved) or 'nothing'} (once each), confighash wrote {len(writes)}, "
        f"{engine.name} wrote {len(engine_wrote)} ({sorted(set(w[1] for w in engine_wrote))})"
        + (f", {synced} sync operation(s)" if isinstance(engine, ArgoCD) else "") + "; "
        f"first new revision after {first:.1f} s, synced and rolled out after {complete:.1f} s; "
        f"not synced: {out_total:.1f} s in all, {drifted:.1f} s of it after the sync of the commit had finished")
    if isinstance(engine, ArgoCD) and syncs is not None:
        check(synced == syncs, f"{what}: {synced} sync operations, not {syncs}")
    measured = {"new revision": first, "synced and rolled out": complete, "not synced": out_total, "not synced after the sync": drifted}
    if syncs is None:
        measured["sync operations"] = synced
    return sha, measured


def homer_title(apps, title):
    cm = find(apps["homer"], "ConfigMap", "homer-config")
    old = cm["data"]["config.yml"].split("\n", 1)
    cm["data"]["config.yml"] = f'title: "{title}"\n' + old[1]


def reads_homer(title):
    pod = pods("homer", selector_of("homer", "deployment", "homer"))
    check(len(pod) == 1, f"{len(pod)} homer pods running, not 1")
    content = read_in("homer", pod[0]["metadata"]["name"], "homer", "cat", "/www/assets/config.yml")
    check(f'title: "{title}"' in content, f"homer's pod reads another config.yml: {content[:120]}")


HOMER = ("homer", "deployment", "homer")
LITELLM = ("litellm", "deployment", "litellm")


def flow(engine, repo):
    """The seed's story with one engine; returns its measured times."""
    times = {}
    apps = examples()
    for app, objects in apps.items():
        repo.write(app, objects)
    sha = repo.commit("the examples")
    engine.start()
    started = time.monotonic()
    engine.create()
    wait_synced(engine, sha, "the first sync", 300)
    for ns, ws in tier.WORKLOADS.items():
        for kind, name in ws:
            wait(f"{kind}/{name} rolled out", lambda: rolled_out(ns, kind, name), 180)
            check(stamp(ns, kind, name), f"{kind}/{name} was not stamped at CREATE")
    times["first sync to all rolled out"] = time.monotonic() - started
    for ns in tier.WORKLOADS:
        labels = kj("get", "namespace", ns)["metadata"].get("labels", {})
        check(labels.get("confighash.dev/enabled") == "true", f"namespace {ns} has not the opt-in label from git")
    barrier()
    revisions = tier.snapshot()
    check(all(r == 1 for r in revisions.values()), f"{engine.name}: workloads rolled after their creation: {revisions}")
    log(f"{engine.name}: first sync at {sha[:12]}, every workload stamped at CREATE and on its first revision ({times['first sync to all rolled out']:.1f} s)")
    cycles(engine, sha, "after the first sync")

    sha, times["homer's config.yml"] = a_commit(
        engine, repo, apps, "homer's config.yml (subPath)", lambda a: homer_title(a, "Homelab v2"), [HOMER], [("homer", "deployments", "homer")])
    reads_homer("Homelab v2")
    cycles(engine, sha, "after homer's config.yml")

    def config_and_deployment(a):
        homer_title(a, "Homelab v3")
        d = find(a["homer"], "Deployment", "homer")
        d["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "TIER_COMMIT", "value": "3"})

    sha, times["homer's ConfigMap and Deployment"] = a_commit(
        engine, repo, apps, "homer's ConfigMap and Deployment in one commit", config_and_deployment, [HOMER], [])
    reads_homer("Homelab v3")
    cycles(engine, sha, "after the ConfigMap and Deployment commit")

    def drop_hand_bump(a):
        annotations = find(a["litellm"], "Deployment", "litellm")["spec"]["template"]["metadata"]["annotations"]
        for key in HAND_BUMP:
            annotations.pop(key)

    def litellm_config(n):
        def edit(a):
            cm = find(a["litellm"], "ConfigMap", "litellm-config")
            key = sorted(cm["data"])[0]
            cm["data"][key] = cm["data"][key].split("\n# change ", 1)[0] + f"\n# change {n}\n"
        return edit

    def template_annotations():
        return kj("-n", "litellm", "get", "deployment", "litellm")["spec"]["template"]["metadata"].get("annotations", {})

    migration = "the migration: the hand-bumped config-checksum removed from git"
    if isinstance(engine, ArgoCD):
        # Measured: Argo CD's server-side diff predicts the removal with a server-side apply,
        # which leaves a field another manager set (the client-side apply that created the
        # Deployment), so the commit compares Synced, starts no sync and rolls nothing; the
        # annotation stays in the cluster until the next sync of the app applies client-side.
        sha, times["the migration"] = a_commit(engine, repo, apps, migration, drop_hand_bump, [], [], syncs=0)
        check(set(HAND_BUMP) <= set(template_annotations()), "the hand bump left the cluster at its commit")
        sha, times["litellm's config, the next sync"] = a_commit(
            engine, repo, apps, "litellm's config, the first sync after the migration", litellm_config(1), [LITELLM], [])
    else:
        sha, times["the migration"] = a_commit(engine, repo, apps, migration, drop_hand_bump, [LITELLM], [])
    check(not set(HAND_BUMP) & set(template_annotations()), f"the hand bump is still on litellm's template: {template_annotations()}")
    check(template_annotations().get(tier.CHECKSUM), "litellm's template lost its stamp in the migration")
    sha, times["litellm's config after the migration"] = a_commit(
        engine, repo, apps, "litellm's config after the migration", litellm_config(2), [LITELLM], [("litellm", "deployments", "litellm")])
    cycles(engine, sha, "after the migration")

    if isinstance(engine, ArgoCD):
        engine.set_compare("ServerSideDiff=true,IncludeMutationWebhook=true")
        mark = engine.refresh()
        wait("argo-cd's refresh with IncludeMutationWebhook", lambda: engine.reconciled(mark), 120, 0.5)
        check(engine.synced_at(sha), f"with IncludeMutationWebhook=true the synced examples show {engine.status()}")
        sha, times["homer's config.yml, IncludeMutationWebhook"] = a_commit(
            engine, repo, apps, "homer's config.yml with IncludeMutationWebhook=true", lambda a: homer_title(a, "Homelab v4"),
            [HOMER], [("homer", "deployments", "homer")])
        reads_homer("Homelab v4")
        # The server-side diff of an unchanged live object comes from a cache until a refresh is
        # requested: refreshed in the change window, the dry-run carries the new stamp.
        sha, times["homer's config.yml, IncludeMutationWebhook, refreshed in the window"] = a_commit(
            engine, repo, apps, "homer's config.yml with IncludeMutationWebhook=true, refreshed in the change window",
            lambda a: homer_title(a, "Homelab v5"), [HOMER], [("homer", "deployments", "homer")], syncs=None, refresh_in_window=True)
        reads_homer("Homelab v5")
        cycles(engine, sha, "with IncludeMutationWebhook=true")
        engine.set_compare(ArgoCD.COMPARE)

    # Drift: a hand edit of a field git holds is put back; the stamp, which git does not hold, stays.
    offset = audit_offset()
    kubectl("-n", "homer", "scale", "deployment/homer", "--replicas=2")
    mark = engine.refresh()
    wait(f"{engine.name} to put homer's replicas back", lambda: kj("-n", "homer", "get", "deployment", "homer")["spec"]["replicas"] == 1, 120, 0.5)
    wait(f"{engine.name}'s reconcile", lambda: engine.reconciled(mark), 120, 0.5)
    check(stamp("homer", "deployment", "homer"), "the drift correction removed the stamp")
    corrections = engine_writes(engine, offset, {"deployments"})
    log(f"{engine.name}: a hand-scaled Deployment put back by {len(corrections)} write(s); the stamp kept")
    cycles(engine, sha, "after a drift correction")

    # Prune: an app's manifests deleted from git leave nothing behind.
    repo.remove("backstage")
    del apps["backstage"]
    started = time.monotonic()
    sha = push(engine, repo, "backstage removed")
    wait("backstage's namespace gone", lambda: kubectl("get", "namespace", "backstage", "--ignore-not-found").strip() == "", 240, 0.5)
    times["prune of backstage"] = time.monotonic() - started
    wait_synced(engine, sha, "backstage removed")
    log(f"{engine.name}: backstage removed from git, its namespace and everything in it gone in {times['prune of backstage']:.1f} s")
    return times


def teardown(engine):
    """Deleting the engine's app prunes everything it made."""
    started = time.monotonic()
    engine.delete()
    for ns in tier.WORKLOADS:
        wait(f"namespace {ns} gone", lambda: kubectl("get", "namespace", ns, "--ignore-not-found").strip() == "", 240, 0.5)
    log(f"{engine.name}: its app deleted, every namespace it made gone in {time.monotonic() - started:.1f} s")
    stop(keep=("git-server",))


def test_install():
    shutil.rmtree(STATE, ignore_errors=True)
    tier.test_quick_start_install()
    tier.make_barrier()
    os.makedirs(os.path.join(STATE, "git"), exist_ok=True)
    start("git-server", ["python3", GIT_SERVER, "--root", os.path.join(STATE, "git"), "--listen", f"127.0.0.1:{GIT_PORT}"])
    wait("the git server", lambda: tier.run("curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{GIT_PORT}/", check=False).returncode == 0, 30)


RESULTS = {}


def test_flux():
    repo = Repo("flux")
    engine = Flux(repo)
    RESULTS["flux"] = flow(engine, repo)
    teardown(engine)


def test_argo_cd():
    repo = Repo("argo-cd")
    engine = ArgoCD(repo)
    RESULTS["argo-cd"] = flow(engine, repo)
    teardown(engine)


TESTS = [test_install, test_flux, test_argo_cd]


def main():
    try:
        passed, failed = tier.run_checks(TESTS, always=("install",))
    finally:
        stop()
    for engine, times in RESULTS.items():
        for what, measured in times.items():
            figures = ", ".join(f"{k} {v}" if isinstance(v, int) else f"{k} {v:.1f} s" for k, v in measured.items()) if isinstance(measured, dict) else f"{measured:.1f} s"
            print(f"gitops: {engine}: {what}: {figures}")
    print(f"gitops: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
