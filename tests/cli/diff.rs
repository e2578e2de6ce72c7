//! `confighash diff` end to end: the real binary on two revisions of rendered manifests.

use std::io::Write;
use std::process::{Command, Stdio};

const SECRET_VALUE: &str = "hunter2-very-secret";

/// The base revision: a namespace's config and the workloads that use it.
fn base() -> String {
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata: {{name: app-env, namespace: shop}}
data: {{LOG_LEVEL: info, PORT: "8080"}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: keyed, namespace: shop}}
data: {{A: one, B: two}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: quiet, namespace: shop, annotations: {{confighash.dev/ignore: "true"}}}}
data: {{X: one}}
---
apiVersion: v1
kind: Secret
metadata: {{name: db, namespace: shop}}
data: {{password: {password}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
        - name: web
          image: web:1
          envFrom: [{{configMapRef: {{name: app-env}}}}, {{configMapRef: {{name: elsewhere}}}}]
          env: [{{name: PW, valueFrom: {{secretKeyRef: {{name: db, key: password}}}}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: api, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: api}}}}
  template:
    metadata: {{labels: {{app: api}}}}
    spec:
      containers:
        - name: api
          image: api:1
          env: [{{name: A, valueFrom: {{configMapKeyRef: {{name: keyed, key: A}}}}}}]
          envFrom: [{{configMapRef: {{name: quiet}}}}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db, namespace: shop}}
spec:
  serviceName: db
  updateStrategy: {{type: OnDelete}}
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec:
      containers: [{{name: db, image: db:1, envFrom: [{{secretRef: {{name: db}}}}]}}]
---
apiVersion: batch/v1
kind: CronJob
metadata: {{name: report, namespace: shop}}
spec:
  schedule: "0 * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers: [{{name: r, image: r:1, envFrom: [{{configMapRef: {{name: app-env}}}}]}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: retired, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: retired}}}}
  template:
    metadata: {{labels: {{app: retired}}}}
    spec:
      containers: [{{name: r, image: r:1}}]
"#,
        password = base64(SECRET_VALUE)
    )
}

fn base64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Runs `confighash diff` with `base` and `head` as files; returns (exit code, stdout, stderr).
fn diff(base: &str, head: &str, extra: &[&str]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (b, h) = (dir.path().join("base.yaml"), dir.path().join("head.yaml"));
    std::fs::write(&b, base).unwrap();
    std::fs::write(&h, head).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_confighash"))
        .args([
            "diff",
            "--base",
            b.to_str().unwrap(),
            "--head",
            h.to_str().unwrap(),
        ])
        .args(extra)
        .env_clear()
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// The lines of the text report for `kind ns/name: verdict`: its header and its reasons.
fn section(report: &str, header: &str) -> String {
    let mut lines = report.lines().skip_while(|l| !l.starts_with(header));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("{header} is not in:\n{report}"));
    std::iter::once(first)
        .chain(lines.take_while(|l| l.starts_with("  ")))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn nothing_changed_rolls_nothing_and_exits_zero() {
    let (code, out, err) = diff(&base(), &base(), &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("no workload rolls"), "{out}");
    assert!(
        out.contains("outside the manifests, assumed unchanged: ConfigMap elsewhere in shop"),
        "{out}"
    );
}

#[test]
fn a_config_change_rolls_what_reads_it_and_names_the_keys() {
    let head = base().replace("LOG_LEVEL: info", "LOG_LEVEL: debug");
    let (code, out, _) = diff(&base(), &head, &[]);
    assert_eq!(code, 1, "{out}");
    let web = section(&out, "Deployment shop/web: rolls");
    assert!(web.contains("ConfigMap app-env: keys LOG_LEVEL"), "{out}");
    let report = section(&out, "CronJob shop/report: rolls");
    assert!(report.contains("the next Job uses the new config"), "{out}");
    assert!(!out.contains("api"), "{out}");
    // Paused: the stamp changes, its pods wait.
    let paused = |t: String| {
        t.replace(
            "metadata: {name: web, namespace: shop}\nspec:\n",
            "metadata: {name: web, namespace: shop}\nspec:\n  paused: true\n",
        )
    };
    let (_, out, _) = diff(&paused(base()), &paused(head), &[]);
    assert!(
        section(&out, "Deployment shop/web: rolls")
            .contains("paused: the stamp changes, its pods do not roll by themselves"),
        "{out}"
    );
}

/// A configured kind (`--workload-kind`) rolls like a Deployment; without the flag it is not a
/// workload.
#[test]
fn a_configured_kind_rolls_with_the_flag() {
    let clone_set = "
---
apiVersion: apps.kruise.io/v1alpha1
kind: CloneSet
metadata: {name: clone-web, namespace: shop}
spec:
  selector: {matchLabels: {app: clone-web}}
  template:
    metadata: {labels: {app: clone-web}}
    spec:
      containers:
        - name: web
          image: example/web:1
          envFrom: [{configMapRef: {name: app-env}}]
";
    let base = base() + clone_set;
    let head = base.replace("LOG_LEVEL: info", "LOG_LEVEL: debug");
    let flag = "--workload-kind=apps.kruise.io/v1alpha1/CloneSet=/spec/template";
    let (code, out, _) = diff(&base, &head, &[flag]);
    assert_eq!(code, 1, "{out}");
    let rolls = section(&out, "CloneSet shop/clone-web: rolls");
    assert!(rolls.contains("ConfigMap app-env: keys LOG_LEVEL"), "{out}");
    let (_, out, _) = diff(&base, &head, &[]);
    assert!(!out.contains("clone-web"), "{out}");
}

#[test]
fn a_template_change_rolls_as_itself() {
    let head = base().replace("image: api:1", "image: api:2");
    let (code, out, _) = diff(&base(), &head, &[]);
    assert_eq!(code, 1);
    assert!(
        section(&out, "Deployment shop/api: rolls").contains("its pod template changed"),
        "{out}"
    );
}

#[test]
fn keys_not_read_metadata_and_ignored_objects_roll_nothing() {
    let head = base()
        .replace("data: {A: one, B: two}", "data: {A: one, B: three}")
        .replace(
            "metadata: {name: app-env, namespace: shop}",
            "metadata: {name: app-env, namespace: shop, labels: {team: a}}",
        )
        .replace("data: {X: one}", "data: {X: two}");
    let (code, out, _) = diff(&base(), &head, &[]);
    assert_eq!(code, 0, "{out}");
    let api = section(&out, "Deployment shop/api: does-not-roll");
    assert!(
        api.contains("ConfigMap keyed: keys it does not read changed (B)"),
        "{out}"
    );
    assert!(
        api.contains("ConfigMap quiet: ignored (confighash.dev/ignore)"),
        "{out}"
    );
    let web = section(&out, "Deployment shop/web: does-not-roll");
    assert!(
        web.contains("ConfigMap app-env: its metadata changed, not its data"),
        "{out}"
    );
}

#[test]
fn a_removed_required_reference_keeps_the_stamp() {
    let text = base();
    let start = text
        .find("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: keyed")
        .unwrap();
    let end = start + text[start..].find("---\n").unwrap() + 4;
    let head = format!("{}{}", &text[..start], &text[end..]);
    let (code, out, _) = diff(&base(), &head, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        section(&out, "Deployment shop/api: does-not-roll")
            .contains("removed; a required reference that is absent keeps the stamp"),
        "{out}"
    );
}

#[test]
fn added_and_removed_workloads_are_listed_and_do_not_count_as_rolls() {
    let head = base().replace(
        "name: retired, namespace: shop",
        "name: fresh, namespace: shop",
    );
    let (code, out, _) = diff(&base(), &head, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Deployment shop/fresh: added"), "{out}");
    assert!(out.contains("Deployment shop/retired: removed"), "{out}");
}

#[test]
fn secrets_compare_string_data_over_data_and_never_show_a_value() {
    // The same password written as stringData: nothing rolls.
    let same = base().replace(
        &format!("data: {{password: {}}}", base64(SECRET_VALUE)),
        &format!("stringData: {{password: {SECRET_VALUE}}}"),
    );
    let (code, out, _) = diff(&base(), &same, &[]);
    assert_eq!(code, 0, "{out}");
    // A new password rolls web and marks db's OnDelete; no value is shown in any format.
    let changed = base().replace(
        &format!("data: {{password: {}}}", base64(SECRET_VALUE)),
        "stringData: {password: rotated-secret-value}",
    );
    for format in ["text", "json", "markdown"] {
        let (code, out, err) = diff(&base(), &changed, &["-o", format]);
        assert_eq!(code, 1, "{format}: {out}{err}");
        for value in [SECRET_VALUE, "rotated-secret-value", &base64(SECRET_VALUE)] {
            assert!(
                !out.contains(value) && !err.contains(value),
                "{format}: {out}{err}"
            );
        }
        assert!(
            out.contains("password"),
            "{format}: the key name is shown: {out}"
        );
        assert!(out.contains("OnDelete"), "{format}: {out}");
    }
}

#[test]
fn json_and_markdown_reports() {
    let head = base().replace("LOG_LEVEL: info", "LOG_LEVEL: debug");
    let (_, out, _) = diff(&base(), &head, &["-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["rolls"], true);
    let web = v["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "web")
        .unwrap();
    assert_eq!(web["verdict"], "rolls");
    assert_eq!(web["kind"], "Deployment");
    let (_, md, _) = diff(&base(), &head, &["-o", "markdown"]);
    assert!(
        md.starts_with("### confighash: 2 workloads will roll"),
        "{md}"
    );
    assert!(
        md.contains("| Deployment web | shop | rolls | ConfigMap app-env: keys LOG\\_LEVEL |"),
        "{md}"
    );
}

#[test]
fn one_side_on_standard_input_and_errors_exit_two() {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("base.yaml");
    std::fs::write(&b, base()).unwrap();
    let run = |head_arg: &str, stdin: &str, ns: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_confighash"));
        cmd.args(["diff", "--base", b.to_str().unwrap(), "--head", head_arg])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(ns) = ns {
            cmd.env("CONFIGHASH_DIFF_NAMESPACE", ns);
        }
        let mut child = cmd.spawn().unwrap();
        let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let head = base().replace("LOG_LEVEL: info", "LOG_LEVEL: debug");
    assert_eq!(run("-", &head, None).0, 1);
    let (code, err) = run("-", "kind: [unclosed\n", None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("standard input: document 1"), "{err}");
    // A document with no namespace needs --namespace or its variable.
    let bare = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {A: b}\n";
    assert_eq!(run("-", bare, None).0, 2);
    assert_eq!(run("-", bare, Some("shop")).0, 0);
}
