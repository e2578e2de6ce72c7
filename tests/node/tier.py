#!/usr/bin/env python3
"""The real-node tier's checks: confighash installed as the quick start says, on real nodes, and
the users' stories read inside the containers. Run by scripts/node-tier.sh inside the tier's
network namespace; every wait polls with a deadline.

Counts: rollouts from the revisions the cluster keeps (a Deployment's revision annotation, a
StatefulSet's ControllerRevisions), confighash's writes from the API server's audit log (patches
and updates of workloads by the chart's ServiceAccount). "Nothing happened" is proven with a
barrier: a later change to another ConfigMap whose workload must roll first, so every event
before it has been handled.
"""

import json
import os
import subprocess
import sys
import time
import traceback

KUBECTL = os.environ["NODE_KUBECTL"]
HELM = os.environ["NODE_HELM"]
CHART = os.environ["NODE_CHART"]
DEPLOY = os.environ["NODE_DEPLOY"]
AUDIT = os.environ["NODE_AUDIT_LOG"]
REPOSITORY = os.environ["NODE_IMAGE_REPOSITORY"]
TAG = os.environ["NODE_IMAGE_TAG"]
NEXT_TAG = os.environ["NODE_IMAGE_NEXT_TAG"]
APP_IMAGE = os.environ["NODE_APP_IMAGE"]
EXAMPLES = os.environ["NODE_EXAMPLES"]
NODE_SH = os.environ["NODE_SH"]
NODES = int(os.environ.get("NODE_COUNT", "1"))
STATE = os.environ["NODE_STATE"]
ONLY = [s for s in os.environ.get("NODE_ONLY", "").split(",") if s]
CONFIGHASH = os.environ["NODE_CONFIGHASH"]

NS = "confighash"
RELEASE = "confighash"
USER = f"system:serviceaccount:{NS}:{RELEASE}"
CHECKSUM = "confighash.dev/checksum"
WORKLOAD_RESOURCES = {"deployments", "statefulsets", "daemonsets", "cronjobs"}
# Names of objects a check creates carry this run's mark, so that a check can run again on the
# same cluster (NODE_ONLY, CONFIGHASH_NODE_KEEP).
RUN = format(int(time.time()) % 1_000_000, "06d")


def log(message):
    print(f"tier.py: {message}", flush=True)


class Failed(Exception):
    pass


def run(*args, input=None, check=True):
    p = subprocess.run(args, input=input, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise Failed(f"{' '.join(args[:6])}... exited {p.returncode}: {p.stderr.strip()[-800:]}")
    return p


def kubectl(*args, input=None, check=True):
    return run(KUBECTL, *args, input=input, check=check).stdout


def kj(*args):
    return json.loads(kubectl(*args, "-o", "json"))


def helm(*args):
    return run(HELM, *args).stdout


def wait(what, check, timeout=120, every=0.25):
    """Polls `check` until it returns a truthy value, which is returned."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Failed as e:
            last = e
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout} s waiting for {what}" + (f" (last: {last})" if last else ""))
        time.sleep(every)


def check(condition, message):
    if not condition:
        raise Failed(message)


# --- the audit log: confighash's own writes ---
def audit_offset():
    try:
        return os.path.getsize(AUDIT)
    except OSError:
        return 0


def audit_events(offset, user):
    """The completed requests of `user` since `offset`, in the order the API server answered them."""
    with open(AUDIT, "rb") as f:
        f.seek(offset)
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("user", {}).get("username") == user and event.get("stage") == "ResponseComplete":
                yield event


def writes_since(offset, namespace=None, name=None, user=USER, verbs=("patch", "update"), resources=WORKLOAD_RESOURCES):
    """A user's (by default confighash's) writes since `offset`, dry-runs left out, by default its
    patches and updates of workloads, as (namespace, resource, name)."""
    out = []
    for event in audit_events(offset, user):
        if event.get("verb") not in verbs or "dryRun=" in event.get("requestURI", ""):
            continue
        ref = event.get("objectRef", {})
        if (resources and ref.get("resource") not in resources) or ref.get("subresource"):
            continue
        if namespace and ref.get("namespace") != namespace:
            continue
        if name and ref.get("name") != name:
            continue
        out.append((ref.get("namespace"), ref.get("resource"), ref.get("name")))
    return out


# --- workloads ---
def revision(ns, kind, name):
    if kind == "deployment":
        d = kj("-n", ns, "get", "deployment", name)
        return int(d["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision", "0"))
    revisions = kj("-n", ns, "get", "controllerrevisions")["items"]
    return sum(
        1
        for r in revisions
        if any(o.get("kind") == "StatefulSet" and o.get("name") == name for o in r["metadata"].get("ownerReferences", []))
    )


def stamp(ns, kind, name):
    w = kj("-n", ns, "get", kind, name)
    template = w["spec"]["jobTemplate"]["spec"]["template"] if kind == "cronjob" else w["spec"]["template"]
    return template["metadata"].get("annotations", {}).get(CHECKSUM)


def rolled_out(ns, kind, name):
    """The rollout finished: every replica updated and ready, no old pod left."""
    w = kj("-n", ns, "get", kind, name)
    s, want = w.get("status", {}), w["spec"].get("replicas", 1)
    if s.get("observedGeneration") != w["metadata"]["generation"]:
        return False
    if kind == "deployment":
        return s.get("updatedReplicas") == want and s.get("availableReplicas") == want and s.get("replicas") == want
    return (
        s.get("updatedReplicas") == want
        and s.get("readyReplicas") == want
        and s.get("currentRevision") == s.get("updateRevision")
    )


def pods(ns, selector):
    """Running, not terminating pods of a selector."""
    items = kj("-n", ns, "get", "pods", "-l", selector)["items"]
    return [p for p in items if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def selector_of(ns, kind, name):
    labels = kj("-n", ns, "get", kind, name)["spec"]["selector"]["matchLabels"]
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def read_in(ns, pod, container, *command):
    return kubectl("-n", ns, "exec", pod, "-c", container, "--", *command)


# --- the examples, with their containers replaced by the app image ---
def transform(obj):
    kind = obj["kind"]
    if kind == "CronJob":
        obj["spec"]["suspend"] = True
        spec = obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    elif kind in ("Deployment", "StatefulSet", "DaemonSet"):
        spec = obj["spec"]["template"]["spec"]
    else:
        return obj
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for group, once in (("initContainers", True), ("containers", False)):
        for c in spec.get(group, []):
            files = [
                m["mountPath"]
                for m in c.get("volumeMounts", [])
                if m.get("subPath") and ("configMap" in volumes.get(m["name"], {}) or "secret" in volumes.get(m["name"], {}))
            ]
            c["image"] = APP_IMAGE
            c["imagePullPolicy"] = "Never"
            c["command"] = ["/bin/tier-app"]
            c.pop("args", None)
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                c.pop(probe, None)
            env = [e for e in c.get("env", []) if e["name"] not in ("APP_FILES", "APP_ONCE")]
            # Only when there are files: the API server stores an empty value as none, and an
            # engine that applies client-side would then patch it back on every sync.
            if files:
                env.append({"name": "APP_FILES", "value": " ".join(files)})
            if once:
                env.append({"name": "APP_ONCE", "value": "1"})
            c.pop("env", None)
            if env:  # an empty list is stored as none, as an empty value above
                c["env"] = env
            # The app image is busybox: a user the examples' images would have set.
            c.setdefault("securityContext", {}).setdefault("runAsUser", 65534)
    return obj


def example_objects(name):
    # kubectl reads the YAML; it prints one JSON document per object.
    text = kubectl("create", "--dry-run=client", "-o", "json", "-f", f"{EXAMPLES}/{name}.yaml")
    decoder, items, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        obj, end = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        items += obj["items"] if obj.get("kind") == "List" else [obj]
        at = end
    return [transform(o) for o in items]


def apply(objects):
    kubectl("apply", "--server-side", "--field-manager", "tier", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


WORKLOADS = {
    "homer": [("deployment", "homer")],
    "litellm": [("deployment", "litellm")],
    "searxng": [("deployment", "searxng"), ("statefulset", "searxng-valkey")],
    "backstage": [("deployment", "backstage")],
}


def set_config_map(ns, name, key, value):
    patch = {"data": {key: value}}
    kubectl("-n", ns, "patch", "configmap", name, "--type", "merge", "-p", json.dumps(patch))


def set_secret(ns, name, key, value):
    patch = {"stringData": {key: value}}
    kubectl("-n", ns, "patch", "secret", name, "--type", "merge", "-p", json.dumps(patch))


BARRIER_NS = "tier-barrier"
barrier_count = [0]


def scaled_down(name, config_map=None):
    """A Deployment of no replicas in the barrier's namespace (stamped and touched like any, with
    no pod to wait for), using `config_map` through envFrom."""
    container = {"name": "app", "image": APP_IMAGE, "imagePullPolicy": "Never"}
    if config_map:
        container["envFrom"] = [{"configMapRef": {"name": config_map}}]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": BARRIER_NS},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}},
        },
    }


def barrier_objects(name):
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": BARRIER_NS}, "data": {"n": "0"}},
        scaled_down(name, name),
    ]


def create_stamped(name):
    """Creates a barrier pair and makes sure its Deployment was stamped at CREATE. Right after
    confighash's replicas turn Ready the API server may not reach them yet, and with
    `failurePolicy: Ignore` admits the Deployment unstamped: it is then created again."""
    deadline = time.monotonic() + 90
    while True:
        apply(barrier_objects(name))
        if stamp(BARRIER_NS, "deployment", name):
            return
        check(time.monotonic() < deadline, f"{name} was never stamped at CREATE in 90 s")
        kubectl("-n", BARRIER_NS, "delete", "deployment", name, "--wait=true")


def barrier():
    """Changes a ConfigMap and waits until confighash has touched its Deployment: watch events are
    handled in order, so every event before the change has been handled by then. Each barrier is a
    new ConfigMap changed once, so no barrier is ever held by the flap guard (the chart's
    defaults: 5 change windows in 10 minutes)."""
    barrier_count[0] += 1
    name = f"barrier-{RUN}-{barrier_count[0]}"
    create_stamped(name)
    offset = audit_offset()
    set_config_map(BARRIER_NS, name, "n", "1")
    wait(f"confighash to touch {name}", lambda: writes_since(offset, BARRIER_NS, name), 90)


def make_barrier():
    kubectl("create", "namespace", BARRIER_NS)
    kubectl("label", "namespace", BARRIER_NS, "confighash.dev/enabled=true")
    # The ConfigMap the workloads created by the checks below use.
    create_stamped("barrier")


def snapshot():
    return {(ns, kind, name): revision(ns, kind, name) for ns, ws in WORKLOADS.items() for kind, name in ws}


def assert_nothing_rolled(before, since, what):
    barrier()
    after = snapshot()
    moved = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    check(not moved, f"{what}: workloads rolled: {moved}")
    writes = [w for w in writes_since(since) if w[0] != BARRIER_NS]
    check(not writes, f"{what}: confighash wrote {writes}")


def leader():
    """The pod that holds the Lease (its identity is the pod's name and a suffix per process)."""
    holder = kj("-n", NS, "get", "lease", RELEASE)["spec"].get("holderIdentity") or ""
    return holder.rsplit("_", 1)[0] or None


def confighash_pods():
    return pods(NS, "app.kubernetes.io/name=confighash")


def one_change(ns, kind, name, change, what):
    """Makes a change and checks it rolled exactly this workload once, with one confighash write.
    Returns the new revision."""
    before = snapshot()
    offset = audit_offset()
    started = time.monotonic()
    change()
    wait(f"{what}: a new revision of {kind}/{name}", lambda: revision(ns, kind, name) > before[(ns, kind, name)], 90)
    first = time.monotonic() - started
    wait(f"{what}: the rollout of {kind}/{name}", lambda: rolled_out(ns, kind, name), 120)
    complete = time.monotonic() - started
    barrier()
    after = snapshot()
    check(after[(ns, kind, name)] == before[(ns, kind, name)] + 1, f"{what}: {after[(ns, kind, name)] - before[(ns, kind, name)]} revisions, not 1")
    others = {k: (before[k], after[k]) for k in before if k != (ns, kind, name) and before[k] != after[k]}
    check(not others, f"{what}: other workloads rolled: {others}")
    writes = [w for w in writes_since(offset) if w[0] != BARRIER_NS]
    check(writes == [(ns, kind + "s", name)], f"{what}: confighash's writes were {writes}, not one of {kind}/{name}")
    log(f"{what}: one rollout, one write; new revision after {first:.1f} s, rollout complete after {complete:.1f} s")
    return after[(ns, kind, name)]


# --- the checks ---
def test_quick_start_install():
    started = time.monotonic()
    helm(
        "install", RELEASE, CHART, "--namespace", NS, "--create-namespace",
        "--set", f"image.repository={REPOSITORY}", "--set", f"image.tag={TAG}", "--set", "image.pullPolicy=Never",
    )
    kubectl("-n", NS, "rollout", "status", f"deployment/{RELEASE}", "--timeout=180s")
    log(f"helm install to rollout complete: {time.monotonic() - started:.1f} s")
    ready = [p for p in confighash_pods() if all(c.get("ready") for c in p["status"].get("containerStatuses", []))]
    check(len(ready) == 2, f"{len(ready)} confighash pods Ready, not 2")
    names = {p["metadata"]["name"] for p in ready}
    holder = wait("a leader", lambda: leader() in names and leader(), 60)
    log(f"the Lease is held by {holder}")
    check(kj("-n", NS, "get", "secret", f"{RELEASE}-certs")["data"].get("ca.crt"), "no CA in the certificates Secret")
    def bundles():
        hooks = kj("get", "mutatingwebhookconfiguration", RELEASE)["webhooks"]
        return len(hooks) == 2 and all(h["clientConfig"].get("caBundle") for h in hooks) and hooks

    hooks = wait("both caBundles written", bundles, 60)
    for h in hooks:
        check("url" not in h["clientConfig"] and h["clientConfig"].get("service", {}).get("name") == RELEASE, f"{h['name']} does not call the Service: {h['clientConfig']}")
    if NODES > 1:
        nodes = {p["spec"]["nodeName"] for p in ready}
        log(f"confighash's replicas run on {sorted(nodes)}")


def test_examples_stamped_at_create():
    make_barrier()
    for name in WORKLOADS:
        apply(example_objects(name))
    for ns, ws in WORKLOADS.items():
        for kind, name in ws:
            check(stamp(ns, kind, name), f"{kind}/{name} in {ns} was not stamped at CREATE")
            wait(f"{kind}/{name} in {ns} rolled out", lambda: rolled_out(ns, kind, name), 180)
    for cronjob in kubectl("-n", "backstage", "get", "cronjob", "-o", "name").split():
        check(stamp("backstage", "cronjob", cronjob.split("/", 1)[1]), f"{cronjob} was not stamped at CREATE")
    # Only the first revision: nothing rolled them after their creation.
    revisions = snapshot()
    check(all(r == 1 for r in revisions.values()), f"workloads rolled after their creation: {revisions}")
    pod = pods("homer", selector_of("homer", "deployment", "homer"))[0]
    content = read_in("homer", pod["metadata"]["name"], "homer", "cat", "/www/assets/config.yml")
    check('title: "Homelab"' in content, f"homer's container reads another config.yml: {content[:200]}")


def test_config_map_change_rolls_homer_once():
    old = pods("homer", selector_of("homer", "deployment", "homer"))
    cm = kj("-n", "homer", "get", "configmap", "homer-config")
    new = cm["data"]["config.yml"].replace('title: "Homelab"', 'title: "Homelab v2"')
    one_change("homer", "deployment", "homer", lambda: set_config_map("homer", "homer-config", "config.yml", new), "homer's config.yml (subPath)")
    now = pods("homer", selector_of("homer", "deployment", "homer"))
    check(len(now) == 1 and now[0]["metadata"]["uid"] != old[0]["metadata"]["uid"], "homer's pod was not replaced")
    content = read_in("homer", now[0]["metadata"]["name"], "homer", "cat", "/www/assets/config.yml")
    check('title: "Homelab v2"' in content, f"the new pod reads the old config.yml: {content[:200]}")
    logs = kubectl("-n", "homer", "logs", now[0]["metadata"]["name"], "-c", "homer")
    check('title: "Homelab v2"' in logs, "the new pod's app did not print the new config.yml at start")


def events(ns, name, reason):
    """confighash's Events of a reason on an object, each counted once."""
    items = kj("-n", ns, "get", "events", "--field-selector", f"involvedObject.name={name},reason={reason}")["items"]
    return sum(e.get("count") or 1 for e in items if (e.get("reportingComponent") or e.get("source", {}).get("component")) == "confighash")


def test_the_rollout_of_a_change_is_recorded_complete():
    """The real Deployment controller and real pods finish the rollout homer's change started:
    confighash records one RolloutComplete Event for it."""
    wait("RolloutComplete on homer", lambda: events("homer", "homer", "RolloutComplete") >= 1, 90)
    check(events("homer", "homer", "RolloutComplete") == 1, "more than one RolloutComplete for one change")


def test_a_rollout_whose_new_pods_crash_is_recorded_stalled():
    """A change the app cannot start with: the new pod crash-loops, the Deployment passes its
    progress deadline (ProgressDeadlineExceeded, from the real controller), confighash records
    RolloutStalled, and the old pod goes on serving the old config."""
    ns = "tier-stall"
    kubectl("create", "namespace", ns)
    kubectl("label", "namespace", ns, "confighash.dev/enabled=true")
    objects = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": ns}, "data": {"config.yml": "broken: false\n"}},
        {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app", "namespace": ns},
            "spec": {
                "replicas": 1, "progressDeadlineSeconds": 10, "selector": {"matchLabels": {"app": "stall"}},
                "strategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                "template": {"metadata": {"labels": {"app": "stall"}}, "spec": {
                    "containers": [{"name": "app", "image": APP_IMAGE, "imagePullPolicy": "Never", "command": ["/bin/tier-app"],
                                    "env": [{"name": "APP_FILES", "value": "/etc/app/config.yml"}],
                                    # Ready only on a config it can run with, as a real app's probe: a
                                    # crash-looping container is then never Ready for an instant,
                                    # which the controller would count as progress.
                                    "readinessProbe": {"exec": {"command": ["/bin/sh", "-c", "! grep -q '^broken: true' /etc/app/config.yml"]}, "periodSeconds": 1},
                                    "volumeMounts": [{"name": "config", "mountPath": "/etc/app/config.yml", "subPath": "config.yml"}]}],
                    "volumes": [{"name": "config", "configMap": {"name": "app"}}]}},
            },
        },
    ]
    apply(objects)
    wait("the app rolled out", lambda: rolled_out(ns, "deployment", "app"), 120)
    old = pods(ns, "app=stall")[0]["metadata"]["name"]
    offset = audit_offset()
    set_config_map(ns, "app", "config.yml", "broken: true\n")
    wait("confighash to touch the app", lambda: writes_since(offset, ns, "app"), 60)

    def deadline_passed():
        conditions = kj("-n", ns, "get", "deployment", "app")["status"].get("conditions", [])
        return any(c["type"] == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded" for c in conditions)

    wait("ProgressDeadlineExceeded", deadline_passed, 120)
    wait("RolloutStalled on the app", lambda: events(ns, "app", "RolloutStalled") >= 1, 60)
    check("broken: false" in read_in(ns, old, "app", "cat", "/etc/app/config.yml"), "the old pod does not serve the old config")
    check(writes_since(offset, ns, "app") == [(ns, "deployments", "app")], "confighash touched the stalled Deployment again")
    kubectl("delete", "namespace", ns, "--wait=false")


WAVE_NS = "tier-wave"
WAVE_SIZE = 20


def wave_objects(ns, size):
    """`size` Deployments of the app, one replica each, reading the progressive ConfigMap `shared`
    through a subPath mount (never refreshed in place: a pod shows the config it started with).
    No readiness probe: a container that exits on its config may look Ready for an instant, which
    the wave must not take for health."""
    objects = [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shared", "namespace": ns, "annotations": {"confighash.dev/rollout": "progressive"}},
        "data": {"config.yml": "broken: false\nversion: 1\n"},
    }]
    for i in range(size):
        name = f"w{i:02d}"
        objects.append({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {
                "replicas": 1, "selector": {"matchLabels": {"app": name}},
                "strategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "image": APP_IMAGE, "imagePullPolicy": "Never", "command": ["/bin/tier-app"],
                                    "env": [{"name": "APP_FILES", "value": "/etc/app/config.yml"}],
                                    "volumeMounts": [{"name": "config", "mountPath": "/etc/app/config.yml", "subPath": "config.yml"}]}],
                    "volumes": [{"name": "config", "configMap": {"name": "shared"}}]}},
            },
        })
    return objects


def wave_names():
    return [f"w{i:02d}" for i in range(WAVE_SIZE)]


def serving(ns, name, path="/etc/app/config.yml"):
    """The config the running, Ready pods of a Deployment read (inside their containers)."""
    out = []
    for p in pods(ns, f"app={name}"):
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        if ready:
            out.append(read_in(ns, p["metadata"]["name"], "app", "cat", path))
    return out


def wave_rolled(ns, revisions, want):
    """Whether every Deployment is at its revision in `want` (a dict name -> revision) and rolled out."""
    return all(revision(ns, "deployment", n) == want[n] and rolled_out(ns, "deployment", n) for n in revisions)


def test_progressive_wave_halts_a_broken_config_at_the_first_workload():
    """20 Deployments share a ConfigMap marked progressive. A broken change rolls exactly one of
    them, whose new pod crash-loops; the wave halts (WaveHalted on the ConfigMap and on that
    Deployment, confighash_waves_halted 1) and the 19 others keep serving the old config, read
    inside their containers. The fix rolls all 20 once, batch by batch; then a good change rolls
    all 20 once more while the leader is deleted in the middle of the wave."""
    ns = WAVE_NS
    kubectl("create", "namespace", ns)
    kubectl("label", "namespace", ns, "confighash.dev/enabled=true")
    apply(wave_objects(ns, WAVE_SIZE))
    names = wave_names()
    wait("the 20 Deployments rolled out", lambda: all(rolled_out(ns, "deployment", n) for n in names), 300, every=2)
    base = {n: revision(ns, "deployment", n) for n in names}
    stamps = {n: stamp(ns, "deployment", n) for n in names}
    check(all(stamps.values()), "a Deployment of the wave is not stamped at CREATE")

    # The broken change.
    offset = audit_offset()
    changed = time.monotonic()
    set_config_map(ns, "shared", "config.yml", "broken: true\nversion: 2\n")
    wait("WaveHalted on the ConfigMap", lambda: events(ns, "shared", "WaveHalted") >= 1, 400, every=1)
    halted_after = time.monotonic() - changed
    rolled = [n for n in names if revision(ns, "deployment", n) != base[n]]
    check(rolled == ["w00"], f"the broken change rolled {rolled}, not the first dependent alone")
    check(events(ns, "w00", "WaveHalted") == 1, "no WaveHalted on the halted Deployment")
    looping = [p for p in kj("-n", ns, "get", "pods", "-l", "app=w00")["items"]
               if any(c.get("restartCount", 0) > 0 for c in p["status"].get("containerStatuses", []))]
    check(looping, "the halted Deployment's new pod did not restart")
    halted_gauge = pod_metric(next(p for p in confighash_pods() if p["metadata"]["name"] == leader()), "confighash_waves_halted")
    check(halted_gauge == 1, f"confighash_waves_halted is {halted_gauge} on the leader")
    # explain of a Deployment that waits says why.
    explained = run(CONFIGHASH, "explain", "-n", ns, "deployment/w05", check=False).stdout
    check("waits behind the halted progressive wave" in " ".join(explained.split()), f"explain of a waiting Deployment: {explained[-1200:]}")
    untouched = [n for n in names[1:] if revision(ns, "deployment", n) == base[n] and stamp(ns, "deployment", n) == stamps[n]]
    check(len(untouched) == 19, f"only {len(untouched)} of the 19 others untouched")
    for n in names[1:]:
        configs = serving(ns, n)
        check(configs and all("version: 1" in c and "broken: false" in c for c in configs), f"{n} does not serve the old config: {configs}")
    writes = writes_since(offset, ns)
    check(writes == [(ns, "deployments", "w00")], f"confighash's writes for the broken change: {writes}")
    log(f"wave: broken change to halt {halted_after:.1f} s; 1 rolled, 19 untouched serving version 1")

    # The fix: a new wave from the first dependent, w00 included; each of the 20 rolls once.
    offset = audit_offset()
    changed = time.monotonic()
    set_config_map(ns, "shared", "config.yml", "broken: false\nversion: 3\n")
    want = {n: base[n] + (2 if n == "w00" else 1) for n in names}
    wait("the fix rolled all 20", lambda: wave_rolled(ns, names, want), 900, every=1)
    fixed_after = time.monotonic() - changed
    writes = writes_since(offset, ns)
    check(sorted(writes) == sorted((ns, "deployments", n) for n in names), f"confighash's writes for the fix: {writes}")
    for n in names:
        configs = serving(ns, n)
        check(configs and all("version: 3" in c for c in configs), f"{n} does not serve the fix: {configs}")
    halted_gauge = pod_metric(next(p for p in confighash_pods() if p["metadata"]["name"] == leader()), "confighash_waves_halted")
    check(halted_gauge == 0, f"confighash_waves_halted is {halted_gauge} after the fix")
    log(f"wave: fix to the last of 20 rollouts {fixed_after:.1f} s, each rolled once")

    # A good change, the leader deleted once the second batch has rolled: the new leader resumes
    # from the stamps and touches no Deployment twice.
    offset = audit_offset()
    base = {n: revision(ns, "deployment", n) for n in names}
    changed = time.monotonic()
    set_config_map(ns, "shared", "config.yml", "broken: false\nversion: 4\n")
    wait("the first two batches rolled", lambda: sum(revision(ns, "deployment", n) != base[n] for n in names) >= 3, 300, every=1)
    old_leader = leader()
    kubectl("-n", NS, "delete", "pod", old_leader, "--wait=false")
    want = {n: base[n] + 1 for n in names}
    wait("the good change rolled all 20", lambda: wave_rolled(ns, names, want), 900, every=1)
    good_after = time.monotonic() - changed
    writes = writes_since(offset, ns)
    check(sorted(writes) == sorted((ns, "deployments", n) for n in names), f"confighash's writes for the good change: {writes}")
    check(leader() != old_leader, "the leader did not change")
    log(f"wave: good change with the leader deleted mid-wave to the last of 20 rollouts {good_after:.1f} s, each rolled once")
    kubectl("delete", "namespace", ns, "--wait=false")


MIXED_NS = "tier-mixed-keys"


def mixed_key_objects(ns):
    """A progressive ConfigMap `shared` with two keys, and eight Deployments of the app, each
    mounting one key of it through a volume whose `items` name that key alone (subPath): w00 to
    w02 read `other.yml`, w03 to w07 read `config.yml`."""
    objects = [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shared", "namespace": ns, "annotations": {"confighash.dev/rollout": "progressive"}},
        "data": {"config.yml": "broken: false\nversion: 1\n", "other.yml": "broken: false\n"},
    }]
    for i in range(8):
        name = f"w{i:02d}"
        key = "other.yml" if i < 3 else "config.yml"
        objects.append({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {
                "replicas": 1, "selector": {"matchLabels": {"app": name}},
                "strategy": {"rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "app", "image": APP_IMAGE, "imagePullPolicy": "Never", "command": ["/bin/tier-app"],
                                    "env": [{"name": "APP_FILES", "value": f"/etc/app/{key}"}],
                                    "volumeMounts": [{"name": "config", "mountPath": f"/etc/app/{key}", "subPath": key}]}],
                    "volumes": [{"name": "config", "configMap": {"name": "shared", "items": [{"key": key, "path": key}]}}]}},
            },
        })
    return objects


def test_progressive_wave_of_one_key_rolls_its_first_user_alone():
    """A progressive ConfigMap with two keys: its first three dependents (by name) read one key,
    the other five the other. A broken change of the second key rolls exactly one workload, the
    first that reads it (w03), whose new pod crash-loops, and the wave halts there: the dependents
    of the other key are neither touched nor counted, and four of the changed key wait."""
    ns = MIXED_NS
    kubectl("create", "namespace", ns)
    kubectl("label", "namespace", ns, "confighash.dev/enabled=true")
    apply(mixed_key_objects(ns))
    names = [f"w{i:02d}" for i in range(8)]
    wait("the 8 Deployments rolled out", lambda: all(rolled_out(ns, "deployment", n) for n in names), 300, every=2)
    base = {n: revision(ns, "deployment", n) for n in names}
    offset = audit_offset()
    changed = time.monotonic()
    set_config_map(ns, "shared", "config.yml", "broken: true\nversion: 2\n")
    wait("WaveHalted on the ConfigMap", lambda: events(ns, "shared", "WaveHalted") >= 1, 400, every=1)
    halted_after = time.monotonic() - changed
    rolled = [n for n in names if revision(ns, "deployment", n) != base[n]]
    check(rolled == ["w03"], f"the broken change of one key rolled {rolled}, not its first user alone")
    check(events(ns, "w03", "WaveHalted") == 1, "no WaveHalted on the halted Deployment")
    writes = writes_since(offset, ns)
    check(writes == [(ns, "deployments", "w03")], f"confighash's writes for the change: {writes}")
    halt = [e for e in kj("-n", ns, "get", "events.events.k8s.io")["items"]
            if e.get("reason") == "WaveHalted" and e.get("regarding", {}).get("name") == "shared"]
    note = halt[0].get("note", "") if halt else ""
    check("4 dependents wait" in note, f"the WaveHalted note does not count the 4 users of the key that wait: {note}")
    for n in names[:3]:
        configs = serving(ns, n, "/etc/app/other.yml")
        check(configs and all("broken: false" in c for c in configs), f"{n} does not serve its key: {configs}")
    for n in names[4:]:
        configs = serving(ns, n)
        check(configs and all("version: 1" in c for c in configs), f"{n}, waiting, does not serve the old config: {configs}")
    log(f"mixed keys: broken change of one key to halt {halted_after:.1f} s; rolled {rolled}; writes {writes}")
    kubectl("delete", "namespace", ns, "--wait=false")


def test_secret_env_change_rolls_searxng_once():
    d = kj("-n", "searxng", "get", "deployment", "searxng")
    env = d["spec"]["template"]["spec"]["containers"][0].get("env", [])
    ref = next(e for e in env if e.get("valueFrom", {}).get("secretKeyRef"))
    secret, key = ref["valueFrom"]["secretKeyRef"]["name"], ref["valueFrom"]["secretKeyRef"]["key"]
    valkey = pods("searxng", selector_of("searxng", "statefulset", "searxng-valkey"))
    one_change("searxng", "deployment", "searxng", lambda: set_secret("searxng", secret, key, "rotated-by-the-tier"), f"searxng's Secret {secret} (env)")
    pod = pods("searxng", selector_of("searxng", "deployment", "searxng"))[0]
    check(f"{ref['name']}=rotated-by-the-tier" in read_in("searxng", pod["metadata"]["name"], d["spec"]["template"]["spec"]["containers"][0]["name"], "env"), "the new pod's environment has the old value")
    check([p["metadata"]["uid"] for p in pods("searxng", selector_of("searxng", "statefulset", "searxng-valkey"))] == [p["metadata"]["uid"] for p in valkey], "valkey, which does not use the Secret, was restarted")


def test_env_from_secret_rolls_litellm_once():
    d = kj("-n", "litellm", "get", "deployment", "litellm")
    container = d["spec"]["template"]["spec"]["containers"][0]
    secret = next(s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s)
    one_change("litellm", "deployment", "litellm", lambda: set_secret("litellm", secret, "TIER_CHECK", "v2"), f"litellm's Secret {secret} (envFrom)")
    pod = pods("litellm", selector_of("litellm", "deployment", "litellm"))[0]
    check("TIER_CHECK=v2" in read_in("litellm", pod["metadata"]["name"], container["name"], "env"), "the new pod does not see the new key")


def test_label_only_and_identical_rewrites_roll_nothing():
    before, offset = snapshot(), audit_offset()
    kubectl("-n", "homer", "label", "configmap", "homer-config", "tier/edited=yes", "--overwrite")
    cm = kj("-n", "homer", "get", "configmap", "homer-config")
    for k in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
        cm["metadata"].pop(k, None)
    kubectl("replace", "-f", "-", input=json.dumps(cm))
    kubectl("-n", "searxng", "annotate", "secret", "--all", "tier/touched=yes", "--overwrite")
    assert_nothing_rolled(before, offset, "label-only edits and an identical rewrite")


def test_change_while_scaled_to_zero_rolls_once_on_return():
    before, offset = snapshot(), audit_offset()
    kubectl("-n", NS, "scale", f"deployment/{RELEASE}", "--replicas=0")
    wait("confighash scaled to 0", lambda: not kj("-n", NS, "get", "pods", "-l", f"app.kubernetes.io/instance={RELEASE}")["items"], 90)
    cm = kj("-n", "homer", "get", "configmap", "homer-config")
    set_config_map("homer", "homer-config", "config.yml", cm["data"]["config.yml"].replace("Homelab v2", "Homelab v3"))
    kubectl("-n", NS, "scale", f"deployment/{RELEASE}", "--replicas=2")
    wait("homer rolled after confighash returned", lambda: revision("homer", "deployment", "homer") > before[("homer", "deployment", "homer")], 120)
    wait("homer's rollout", lambda: rolled_out("homer", "deployment", "homer"), 120)
    barrier()
    after = snapshot()
    check(after[("homer", "deployment", "homer")] == before[("homer", "deployment", "homer")] + 1, "homer did not roll exactly once")
    writes = [w for w in writes_since(offset) if w[0] != BARRIER_NS]
    check(writes == [("homer", "deployments", "homer")], f"confighash's writes: {writes}")
    pod = pods("homer", selector_of("homer", "deployment", "homer"))[0]
    check("Homelab v3" in read_in("homer", pod["metadata"]["name"], "homer", "cat", "/www/assets/config.yml"), "the new pod reads an old config.yml")


def test_leader_deleted_in_a_change_window():
    holder = leader()
    cm = kj("-n", "homer", "get", "configmap", "homer-config")
    new = cm["data"]["config.yml"].replace("Homelab v3", "Homelab v4")

    def change():
        set_config_map("homer", "homer-config", "config.yml", new)
        kubectl("-n", NS, "delete", "pod", holder, "--wait=false")

    one_change("homer", "deployment", "homer", change, "a change with the leader deleted in its window")
    moved = wait("the Lease to move", lambda: leader() != holder and leader(), 60)
    log(f"the Lease moved from {holder} to {moved}")


def test_kubelet_and_containerd_restart_roll_nothing():
    before, offset = snapshot(), audit_offset()
    for n in range(NODES):
        run(NODE_SH, "restart-node", str(n))
    for n in range(NODES):
        wait(f"node-{n} Ready again", lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in kj("get", "node", f"node-{n}")["status"]["conditions"]), 90)
    assert_nothing_rolled(before, offset, "kubelet and containerd killed and restarted")


def admission_failures():
    text = kubectl("get", "--raw", "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("apiserver_admission_webhook_fail_open_count", "apiserver_admission_webhook_rejection_count")) and RELEASE in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def pod_metric(pod, name):
    """The sum of a metric's samples on a confighash pod's admin port (its pod IP, port 8080)."""
    text = run("curl", "-sf", f"http://{pod['status']['podIP']}:8080/metrics").stdout
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name) and not l.startswith("#"))


def test_idle_connections_lose_no_review():
    """kube-apiserver keeps an idle connection to the webhook's Service for 90 s and reuses it: a
    CREATE sent after the connection sat idle past the old 10 s header timeout is stamped, and
    no replica counts a connection error."""
    failures = admission_failures()
    errors = {p["metadata"]["name"]: pod_metric(p, "confighash_webhook_connection_errors_total") for p in confighash_pods()}
    for i in range(3):
        if i:
            time.sleep(11)  # the scenario itself: a connection idle past 10 s, then a review on it
        kubectl("create", "-f", "-", input=json.dumps(scaled_down(f"after-idle-{RUN}-{i}", "barrier")))
        check(stamp(BARRIER_NS, "deployment", f"after-idle-{RUN}-{i}"), f"the CREATE after {11 * i} s idle was admitted unstamped")
    check(admission_failures() == failures, "the API server counted failed admissions")
    after = {p["metadata"]["name"]: pod_metric(p, "confighash_webhook_connection_errors_total") for p in confighash_pods()}
    check(after == errors, f"connection errors counted: before {errors}, after {after}")


def test_helm_upgrade_to_a_new_tag_rolls_nothing():
    before, offset, failures = snapshot(), audit_offset(), admission_failures()
    helm("upgrade", RELEASE, CHART, "--namespace", NS, "--reuse-values", "--set", f"image.tag={NEXT_TAG}")
    # Workloads created while the replicas are replaced: each must be stamped.
    created = 0
    deadline = time.monotonic() + 180
    while True:
        kubectl("create", "-f", "-", input=json.dumps(scaled_down(f"during-upgrade-{RUN}-{created}", "barrier")))
        created += 1
        # Until the old replicas are gone, not only until the new ones are ready: the reviews sent
        # while an old replica shuts down are the ones at risk.
        if rolled_out(NS, "deployment", RELEASE) and len(kj("-n", NS, "get", "pods", "-l", "app.kubernetes.io/name=confighash")["items"]) == 2:
            break
        check(time.monotonic() < deadline, "the upgrade did not finish in 180 s")
    unstamped = [i for i in range(created) if not stamp(BARRIER_NS, "deployment", f"during-upgrade-{RUN}-{i}")]
    check(not unstamped, f"{len(unstamped)} of {created} Deployments created during the upgrade were admitted unstamped")
    image = kj("-n", NS, "get", "deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0]["image"]
    check(image.endswith(":" + NEXT_TAG), f"the upgrade left the image {image}")
    assert_nothing_rolled(before, offset, "helm upgrade to a new tag")
    check(admission_failures() == failures, f"the API server counted {admission_failures() - failures} failed admissions during the upgrade")
    log(f"helm upgrade: {created} Deployments created during it, all stamped; no failed admission")


def test_both_replicas_down():
    kubectl("-n", BARRIER_NS, "delete", "deployment,configmap", "while-down", "--ignore-not-found")
    kubectl("-n", NS, "scale", f"deployment/{RELEASE}", "--replicas=0")
    wait("confighash scaled to 0", lambda: not kj("-n", NS, "get", "pods", "-l", f"app.kubernetes.io/instance={RELEASE}")["items"], 90)
    policy = kj("get", "mutatingwebhookconfiguration", RELEASE)["webhooks"][0]["failurePolicy"]
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "while-down", "namespace": BARRIER_NS}, "data": {"v": "1"}}
    d = scaled_down("while-down", "while-down")
    p = run(KUBECTL, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [config, d]}), check=False)
    log(f"failurePolicy {policy}, both replicas down: kubectl apply exits {p.returncode}: {(p.stdout + p.stderr).strip()[:200]}")
    check(p.returncode == 0 and policy == "Ignore", "with the chart's failurePolicy Ignore a write must be admitted while confighash is down")
    check(stamp(BARRIER_NS, "deployment", "while-down") is None, "admitted with a stamp while no replica ran")
    kubectl("-n", NS, "scale", f"deployment/{RELEASE}", "--replicas=2")
    kubectl("-n", NS, "rollout", "status", f"deployment/{RELEASE}", "--timeout=120s")
    barrier()
    # Reconcile leaves a workload admitted without a stamp (and without an `unstamped` marker)
    # alone, as one that predates confighash (--stamp-existing off); its next change stamps it.
    check(stamp(BARRIER_NS, "deployment", "while-down") is None, "reconcile stamped the workload admitted while confighash was down")
    offset = audit_offset()
    set_config_map(BARRIER_NS, "while-down", "v", "2")
    wait("the workload stamped at its next change", lambda: stamp(BARRIER_NS, "deployment", "while-down"), 60)
    check(writes_since(offset, BARRIER_NS, "while-down") == [(BARRIER_NS, "deployments", "while-down")], "not one write")
    log("once back: the workload admitted unstamped stays so through reconcile, and is stamped by its next change")


def test_drain_the_node_of_a_replica():
    if NODES < 2:
        log("one node: no drain (CONFIGHASH_NODES=2 runs it)")
        return
    victim = confighash_pods()[0]["spec"]["nodeName"]
    kubectl("drain", victim, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s")
    try:
        kubectl("-n", NS, "rollout", "status", f"deployment/{RELEASE}", "--timeout=120s")
        ready = [p for p in confighash_pods() if all(c.get("ready") for c in p["status"].get("containerStatuses", []))]
        check(len(ready) == 2 and all(p["spec"]["nodeName"] != victim for p in ready), f"after the drain of {victim}: {[(p['metadata']['name'], p['spec']['nodeName']) for p in ready]}")
        one_change("homer", "deployment", "homer", lambda: set_config_map("homer", "homer-config", "drain", "1"), f"a change after {victim} was drained")
    finally:
        kubectl("uncordon", victim)


def test_helm_uninstall_leaves_nothing_that_blocks_writes():
    helm("uninstall", RELEASE, "--namespace", NS, "--wait")
    check(not kubectl("get", "mutatingwebhookconfiguration", "-o", "name").strip(), "a webhook configuration is left")
    kubectl("create", "-f", "-", input=json.dumps(scaled_down(f"after-uninstall-{RUN}")))
    left = kubectl("-n", NS, "get", "secrets,leases", "-o", "name").split()
    log(f"left in {NS} after helm uninstall (made by the pods): {left}")
    check(sorted(left) == ["lease.coordination.k8s.io/confighash", "secret/confighash-certs", "secret/confighash-key"], f"left: {left}, not the key and certificate Secrets and the Lease")
    wait("the pods to end", lambda: not kj("-n", NS, "get", "pods")["items"], 90)
    kubectl("delete", "namespace", NS, "--wait=true", "--timeout=90s")


def test_kustomize_install():
    overlay = os.path.join(STATE, "kustomize")
    os.makedirs(overlay, exist_ok=True)
    with open(os.path.join(overlay, "kustomization.yaml"), "w") as f:
        f.write(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources: [{os.path.relpath(DEPLOY, overlay)}]\n"
            f"images:\n  - name: confighash\n    newName: {REPOSITORY}\n    newTag: {TAG}\n"
            "patches:\n  - target: {kind: Deployment, name: confighash}\n"
            "    patch: '[{\"op\": \"add\", \"path\": \"/spec/template/spec/containers/0/imagePullPolicy\", \"value\": \"Never\"}]'\n"
        )
    rendered = run(KUBECTL, "kustomize", "--load-restrictor", "LoadRestrictionsNone", overlay).stdout
    kubectl("apply", "-f", "-", input=rendered)
    kubectl("-n", NS, "rollout", "status", "deployment/confighash", "--timeout=180s")
    names = {p["metadata"]["name"] for p in confighash_pods()}
    wait("a leader", lambda: leader() in names, 60)
    wait("both caBundles written", lambda: all(h["clientConfig"].get("caBundle") for h in kj("get", "mutatingwebhookconfiguration", "confighash")["webhooks"]), 60)
    one_change("homer", "deployment", "homer", lambda: set_config_map("homer", "homer-config", "kustomize", "1"), "a change with deploy/ installed by kustomize")
    kubectl("delete", "-f", "-", "--wait=true", "--timeout=120s", input=rendered)


TESTS = [
    test_quick_start_install,
    test_examples_stamped_at_create,
    test_config_map_change_rolls_homer_once,
    test_the_rollout_of_a_change_is_recorded_complete,
    test_a_rollout_whose_new_pods_crash_is_recorded_stalled,
    test_progressive_wave_halts_a_broken_config_at_the_first_workload,
    test_progressive_wave_of_one_key_rolls_its_first_user_alone,
    test_secret_env_change_rolls_searxng_once,
    test_env_from_secret_rolls_litellm_once,
    test_label_only_and_identical_rewrites_roll_nothing,
    test_change_while_scaled_to_zero_rolls_once_on_return,
    test_leader_deleted_in_a_change_window,
    test_kubelet_and_containerd_restart_roll_nothing,
    test_idle_connections_lose_no_review,
    test_helm_upgrade_to_a_new_tag_rolls_nothing,
    test_both_replicas_down,
    test_drain_the_node_of_a_replica,
    test_helm_uninstall_leaves_nothing_that_blocks_writes,
    test_kustomize_install,
]


def run_checks(tests, always=()):
    """Runs the checks in order (those in NODE_ONLY, and those named in `always`), stopping at the
    first failure: the later checks build on the earlier. Returns (passed, failed)."""
    passed = failed = 0
    for test in tests:
        name = test.__name__[5:]
        if ONLY and name not in ONLY and name not in always:
            continue
        started = time.monotonic()
        try:
            test()
            passed += 1
            log(f"ok {name} ({time.monotonic() - started:.1f} s)")
        except Exception as e:  # every failure is reported
            failed += 1
            log(f"FAILED {name} ({time.monotonic() - started:.1f} s): {e}")
            if not isinstance(e, Failed):
                traceback.print_exc()
            break
    return passed, failed


def main():
    passed, failed = run_checks(TESTS)
    print(f"tier: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
