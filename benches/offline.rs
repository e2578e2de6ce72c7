//! `confighash stamp` and `confighash diff` over rendered manifests of about 8.5 MB (the size of
//! a public chart collection rendered), beside a baseline in the same run: a plain YAML 1.2
//! parse of the same documents into JSON values (`serde_saphyr`), what reading alone costs.
//!
//! The corpus is generated: per app, a ConfigMap, a Secret, a Deployment and a StatefulSet (file
//! modes written as YAML 1.1 octal, as charts write them) and a Service, in the app's namespace;
//! `diff`'s head changes every tenth app's ConfigMap. `cargo bench --bench offline`; without
//! `--bench` (as `cargo test --benches` runs it) the corpus is a twentieth of the size.

use std::fmt::Write as _;
use std::hint::black_box;

use confighash::offline::{self, Options, Source};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn app(i: usize, level: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"---
# Source: app-{i}/templates/configmap.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: app-{i}-config
  namespace: team-{ns}
  labels: {{app.kubernetes.io/name: app-{i}, app.kubernetes.io/managed-by: Helm}}
data:
  LOG_LEVEL: {level}
  PORT: "8080"
  settings.yaml: |
    server:
      port: 8080
      timeout: 30s
    features: [a, b, c]
    description: "app {i} settings, a few lines of them, as a chart writes its config"
---
apiVersion: v1
kind: Secret
metadata:
  name: app-{i}-secret
  namespace: team-{ns}
type: Opaque
data:
  password: cGFzc3dvcmQtZm9yLWFwcA==
  token: dG9rZW4tZm9yLWFwcC10aGF0LWlzLWxvbmdlcg==
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app-{i}
  namespace: team-{ns}
  labels: {{app.kubernetes.io/name: app-{i}}}
spec:
  replicas: 2
  selector:
    matchLabels: {{app.kubernetes.io/name: app-{i}}}
  template:
    metadata:
      labels: {{app.kubernetes.io/name: app-{i}}}
    spec:
      containers:
        - name: app
          image: registry.example.com/app:{i}
          ports: [{{containerPort: 8080, name: http}}]
          envFrom:
            - configMapRef: {{name: app-{i}-config}}
          env:
            - name: PASSWORD
              valueFrom: {{secretKeyRef: {{name: app-{i}-secret, key: password}}}}
          volumeMounts:
            - {{name: settings, mountPath: /etc/app/settings.yaml, subPath: settings.yaml}}
          resources:
            limits: {{cpu: 500m, memory: 256Mi}}
            requests: {{cpu: 100m, memory: 128Mi}}
          readinessProbe:
            httpGet: {{path: /healthz, port: http}}
      volumes:
        - name: settings
          configMap:
            name: app-{i}-config
            defaultMode: 0644
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: app-{i}-db
  namespace: team-{ns}
spec:
  serviceName: app-{i}-db
  selector:
    matchLabels: {{app.kubernetes.io/name: app-{i}-db}}
  template:
    metadata:
      labels: {{app.kubernetes.io/name: app-{i}-db}}
    spec:
      containers:
        - name: db
          image: registry.example.com/db:16
          envFrom: [{{secretRef: {{name: app-{i}-secret}}}}]
          volumeMounts: [{{name: scripts, mountPath: /scripts}}]
      volumes:
        - name: scripts
          configMap:
            name: app-{i}-config
            defaultMode: 0755
            items: [{{key: settings.yaml, path: settings.yaml, mode: 0400}}]
---
apiVersion: v1
kind: Service
metadata:
  name: app-{i}
  namespace: team-{ns}
spec:
  selector: {{app.kubernetes.io/name: app-{i}}}
  ports: [{{port: 80, targetPort: http}}]
"#,
        ns = i % 50
    );
    s
}

fn corpus(bytes: usize, changed: bool) -> String {
    let mut out = String::with_capacity(bytes + 4096);
    let mut i = 0;
    while out.len() < bytes {
        let level = if changed && i % 10 == 0 {
            "debug"
        } else {
            "info"
        };
        out.push_str(&app(i, level));
        i += 1;
    }
    out
}

fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn bench(c: &mut Criterion) {
    let size = if full() { 8_500_000 } else { 425_000 };
    let base = vec![Source {
        name: "base.yaml".into(),
        text: corpus(size, false),
    }];
    let head = vec![Source {
        name: "head.yaml".into(),
        text: corpus(size, true),
    }];
    let options = Options {
        namespace: None,
        key: None,
        explain: false,
        ..Default::default()
    };
    // The run is checked as it is measured: every workload stamped, every tenth app rolls.
    let stamped = offline::run(&base, &options).expect("the corpus stamps");
    assert!(stamped.text.matches("confighash.dev/checksum").count() > 0);
    let report = offline::diff::diff(&base, &head, &options).expect("the corpus diffs");
    assert!(report.rolls());

    let mut group = c.benchmark_group("offline");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(base[0].text.len() as u64));
    group.bench_function("baseline: YAML 1.2 parse into JSON values", |b| {
        b.iter(|| {
            let docs: Vec<serde_json::Value> = base[0]
                .text
                .split("\n---\n")
                .filter(|d| !d.trim().is_empty())
                .map(|d| serde_saphyr::from_str(d).expect("the corpus parses"))
                .collect();
            black_box(docs)
        })
    });
    group.bench_function("stamp", |b| {
        b.iter(|| black_box(offline::run(&base, &options).unwrap()))
    });
    group.bench_function("diff", |b| {
        b.iter(|| black_box(offline::diff::diff(&base, &head, &options).unwrap()))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
