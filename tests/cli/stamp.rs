//! `confighash stamp` end to end: the real binary on files, directories and standard input.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Recipe v2 vector 1: in namespace `default`, and in `shop`.
const VECTOR_1: &str = "v2:plain:842499d32b43c07f94b45c022381da213f8a0e16cd2a2f5e27bea352550be9e8";
const VECTOR_1_SHOP: &str =
    "v2:plain:63fb616d0b3d1936fa1c667467c0f016eff4136898b6af29c79b9dab5a77e927";

fn confighash(args: &[&str], stdin: Option<&str>) -> Output {
    confighash_env(args, &[], stdin)
}

/// Runs the binary with only `env` in its environment.
fn confighash_env(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_confighash"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut input = child.stdin.take().unwrap();
    // The binary may stop before reading its input (a refused key); that is not a failure here.
    let _ = input.write_all(stdin.unwrap_or("").as_bytes());
    drop(input);
    child.wait_with_output().unwrap()
}

fn ok(args: &[&str], stdin: Option<&str>) -> (String, String) {
    ok_env(args, &[], stdin)
}

fn ok_env(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> (String, String) {
    let out = confighash_env(args, env, stdin);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "confighash {args:?} failed: {stderr}");
    (String::from_utf8(out.stdout).unwrap(), stderr)
}

fn fails(args: &[&str], stdin: Option<&str>) -> String {
    fails_env(args, &[], stdin)
}

fn fails_env(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> String {
    let out = confighash_env(args, env, stdin);
    assert!(!out.status.success(), "confighash {args:?} should fail");
    assert!(
        out.stdout.is_empty(),
        "nothing may be half-written: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

/// Splits a stream at its `---` lines, keeping each document's text.
fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "---" {
            docs.push(String::new());
        }
        docs.last_mut().unwrap().push_str(line);
    }
    docs
}

fn yaml(doc: &str) -> serde_json::Value {
    serde_saphyr::from_str(doc.trim_start_matches("---\n")).unwrap()
}

fn stamp_of(doc: &serde_json::Value) -> Option<&str> {
    let template = if doc["kind"] == "CronJob" {
        &doc["spec"]["jobTemplate"]["spec"]["template"]
    } else {
        &doc["spec"]["template"]
    };
    template["metadata"]["annotations"]["confighash.dev/checksum"].as_str()
}

/// A ConfigMap and a Deployment that name no namespace (as a kustomize base does): stamping
/// them needs `--namespace`.
const APP: &str = "\
# The app's environment.
apiVersion: v1
kind: ConfigMap
metadata:
  name: app-env
data:
  LOG_LEVEL: info
  PORT: \"8080\"
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
spec:
  selector: {matchLabels: {app: app}}
  template:
    metadata: {labels: {app: app}}
    spec:
      containers:
        - name: app
          image: example/app:1
          envFrom: [{configMapRef: {name: app-env}}]
";

#[test]
fn stamps_the_first_design_vector_from_yaml() {
    let (out, stderr) = ok(&["stamp", "--namespace", "default", "-f", "-"], Some(APP));
    assert!(stderr.is_empty(), "{stderr}");
    let docs = documents(&out);
    assert_eq!(docs.len(), 2);
    assert_eq!(
        docs[0],
        APP.split("---\n").next().unwrap(),
        "untouched document is byte-identical"
    );
    assert_eq!(stamp_of(&yaml(&docs[1])), Some(VECTOR_1));

    // The namespace enters the stamp: given with --namespace or by the documents themselves.
    let (out, _) = ok(&["stamp", "--namespace", "shop", "-f", "-"], Some(APP));
    assert_eq!(stamp_of(&yaml(&documents(&out)[1])), Some(VECTOR_1_SHOP));
    let in_shop = APP.replace("\nmetadata:\n", "\nmetadata:\n  namespace: shop\n");
    let (out, _) = ok(&["stamp", "-f", "-"], Some(&in_shop));
    assert_eq!(stamp_of(&yaml(&documents(&out)[1])), Some(VECTOR_1_SHOP));
    // A document's own namespace wins over --namespace.
    let (out, _) = ok(
        &["stamp", "--namespace", "default", "-f", "-"],
        Some(&in_shop),
    );
    assert_eq!(stamp_of(&yaml(&documents(&out)[1])), Some(VECTOR_1_SHOP));
}

/// A configured kind (`--workload-kind`, or its environment variable) is stamped at its pointer
/// with the same stamp as a Deployment; without the flag it is left alone; an object of the kind
/// with nothing at the pointer is left as it is, with a warning; a malformed flag names itself.
#[test]
fn stamps_a_configured_kind_at_its_pointer() {
    let scaled_job = "\
---
apiVersion: keda.sh/v1alpha1
kind: ScaledJob
metadata:
  name: nightly
spec:
  jobTargetRef:
    template:
      spec:
        restartPolicy: Never
        containers:
          - name: job
            image: example/job:1
            envFrom: [{configMapRef: {name: app-env}}]
  triggers: [{type: cron, metadata: {start: 0 1 * * *}}]
---
apiVersion: keda.sh/v1alpha1
kind: ScaledJob
metadata:
  name: empty
spec:
  triggers: []
";
    let input = format!("{APP}{scaled_job}");
    let flag = "--workload-kind=keda.sh/v1alpha1/ScaledJob=/spec/jobTargetRef/template";
    let (out, stderr) = ok(
        &["stamp", "--namespace", "default", "-f", "-", flag],
        Some(&input),
    );
    let docs = documents(&out);
    assert_eq!(docs.len(), 4);
    assert_eq!(stamp_of(&yaml(&docs[1])), Some(VECTOR_1));
    let job = yaml(&docs[2]);
    assert_eq!(
        job["spec"]["jobTargetRef"]["template"]["metadata"]["annotations"]["confighash.dev/checksum"],
        VECTOR_1,
        "the same recipe, at the kind's pointer"
    );
    assert_eq!(
        docs[3],
        scaled_job
            .split("---\n")
            .nth(2)
            .map(|d| format!("---\n{d}"))
            .unwrap()
    );
    assert!(
        stderr.contains("ScaledJob")
            && stderr.contains("empty")
            && stderr.contains("left as it is"),
        "{stderr}"
    );
    // The environment variable as the flag.
    let (out, _) = ok_env(
        &["stamp", "--namespace", "default", "-f", "-"],
        &[(
            "CONFIGHASH_WORKLOAD_KIND",
            "keda.sh/v1alpha1/ScaledJob=/spec/jobTargetRef/template",
        )],
        Some(&input),
    );
    assert_eq!(documents(&out)[2], docs[2]);
    // Without it, a ScaledJob is not a workload.
    let (out, _) = ok(
        &["stamp", "--namespace", "default", "-f", "-"],
        Some(&input),
    );
    assert!(!documents(&out)[2].contains("confighash.dev/checksum"));
    let error = fails(
        &[
            "stamp",
            "--namespace",
            "default",
            "-f",
            "-",
            "--workload-kind=ScaledJob",
        ],
        Some(&input),
    );
    assert!(error.contains("--workload-kind"), "{error}");
}

/// No silent `default`: a ConfigMap, Secret or workload that names no namespace, with no
/// `--namespace`, is an error naming the document. `--namespace` reads its own environment
/// variable, CONFIGHASH_STAMP_NAMESPACE, not `certs`' CONFIGHASH_NAMESPACE.
#[test]
fn a_document_without_a_namespace_is_an_error_naming_it() {
    let err = fails(&["stamp", "-f", "-"], Some(APP));
    assert!(err.contains("standard input: document 1 (line 1)"), "{err}");
    assert!(
        err.contains("ConfigMap app-env has no metadata.namespace"),
        "{err}"
    );
    assert!(err.contains("--namespace"), "{err}");

    // The ConfigMap in a namespace, the Deployment in none: the error names the Deployment.
    let half = APP.replacen(
        "  name: app-env\n",
        "  name: app-env\n  namespace: default\n",
        1,
    );
    let err = fails(&["stamp", "--explain", "-f", "-"], Some(&half));
    assert!(err.contains("standard input: document 2"), "{err}");
    assert!(
        err.contains("Deployment app has no metadata.namespace"),
        "{err}"
    );

    let err = fails_env(
        &["stamp", "-f", "-"],
        &[("CONFIGHASH_NAMESPACE", "default")],
        Some(APP),
    );
    assert!(err.contains("has no metadata.namespace"), "{err}");
    let (out, _) = ok_env(
        &["stamp", "-f", "-"],
        &[("CONFIGHASH_STAMP_NAMESPACE", "shop")],
        Some(APP),
    );
    assert_eq!(stamp_of(&yaml(&documents(&out)[1])), Some(VECTOR_1_SHOP));
    // An empty --namespace is none.
    let err = fails(&["stamp", "--namespace", "", "-f", "-"], Some(APP));
    assert!(err.contains("has no metadata.namespace"), "{err}");
}

#[test]
fn stamps_every_example_and_keeps_other_documents_byte_for_byte() {
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")).unwrap()
    {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let p = path.to_str().unwrap();
        let input = std::fs::read_to_string(&path).unwrap();
        let (out, stderr) = ok(&["stamp", "-f", p], None);
        assert!(stderr.is_empty(), "{p}: {stderr}");
        let (before, after) = (documents(&input), documents(&out));
        assert_eq!(before.len(), after.len(), "{p}: document count");
        let mut stamped = 0;
        for (b, a) in before.iter().zip(&after) {
            let kind = yaml(b)["kind"].as_str().unwrap_or_default().to_owned();
            if ["Deployment", "StatefulSet", "DaemonSet", "CronJob"].contains(&kind.as_str()) {
                let stamped_doc = yaml(a);
                let stamp =
                    stamp_of(&stamped_doc).unwrap_or_else(|| panic!("{p}: {kind} not stamped"));
                assert!(stamp.starts_with("v2:plain:"), "{stamp}");
                // Nothing but the stamp changed.
                let mut restored = yaml(a);
                let t = if kind == "CronJob" {
                    &mut restored["spec"]["jobTemplate"]["spec"]["template"]
                } else {
                    &mut restored["spec"]["template"]
                };
                t["metadata"]["annotations"]
                    .as_object_mut()
                    .unwrap()
                    .remove("confighash.dev/checksum");
                if t["metadata"]["annotations"].as_object().unwrap().is_empty() {
                    t["metadata"].as_object_mut().unwrap().remove("annotations");
                }
                assert_eq!(restored, yaml(b), "{p}: {kind} changed beyond its stamp");
                stamped += 1;
            } else {
                assert_eq!(a, b, "{p}: {kind} document must be copied byte for byte");
            }
        }
        assert!(stamped > 0, "{p} has no workload");
        // Stamping stamped output changes nothing.
        let (again, _) = ok(&["stamp", "-f", "-"], Some(&out));
        assert_eq!(again, out, "{p}: stamping is not idempotent");
    }
}

#[test]
fn a_directory_reads_its_yaml_files_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    let (cm, deploy) = APP.split_once("---\n").unwrap();
    std::fs::write(dir.path().join("b-deploy.yaml"), deploy).unwrap();
    std::fs::write(dir.path().join("a-config.yml"), cm).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not yaml: [").unwrap();
    let (out, _) = ok(
        &[
            "stamp",
            "--namespace",
            "default",
            "-f",
            dir.path().to_str().unwrap(),
        ],
        None,
    );
    let docs = documents(&out);
    assert_eq!(docs.len(), 2, "{out}");
    assert_eq!(docs[0], cm);
    assert_eq!(stamp_of(&yaml(&docs[1])), Some(VECTOR_1));
}

#[test]
fn explain_names_each_reference_and_a_missing_one() {
    let input = APP.replace("envFrom: [{configMapRef: {name: app-env}}]", "envFrom: [{configMapRef: {name: app-env}}, {secretRef: {name: app-secrets}}]\n          env:\n            - {name: DB, valueFrom: {configMapKeyRef: {name: db, key: url, optional: true}}}");
    let (out, stderr) = ok(
        &["stamp", "--explain", "--namespace", "default", "-f", "-"],
        Some(&input),
    );
    assert!(out.contains("Deployment default/app"), "{out}");
    assert!(
        out.contains("ConfigMap app-env: whole object, required: found, 2 keys"),
        "{out}"
    );
    assert!(
        out.contains("ConfigMap db: keys url, optional: absent"),
        "{out}"
    );
    assert!(
        out.contains("Secret app-secrets: whole object, required: absent"),
        "{out}"
    );
    assert!(out.contains("stamp: v2:plain:"), "{out}");
    assert!(
        stderr.contains("references Secret app-secrets, which is not in the input"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("ConfigMap db"),
        "optional references are not warned about: {stderr}"
    );
}

#[test]
fn namespaces_keep_references_apart() {
    let other_ns = APP.replacen(
        "  name: app-env\n",
        "  name: app-env\n  namespace: other\n",
        1,
    );
    let (out, _) = ok(
        &["stamp", "--explain", "--namespace", "default", "-f", "-"],
        Some(&other_ns),
    );
    assert!(
        out.contains("ConfigMap app-env: whole object, required: absent"),
        "{out}"
    );
    let (out, _) = ok(
        &["stamp", "--explain", "--namespace", "other", "-f", "-"],
        Some(&other_ns),
    );
    assert!(out.contains("Deployment other/app"), "{out}");
    assert!(out.contains("required: found"), "{out}");
}

#[test]
fn a_key_file_makes_hmac_stamps_and_short_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").unwrap();
    let (out, _) = ok(
        &[
            "stamp",
            "--key-file",
            key.to_str().unwrap(),
            "--namespace",
            "default",
            "-f",
            "-",
        ],
        Some(APP),
    );
    assert_eq!(
        stamp_of(&yaml(&documents(&out)[1])),
        Some("v2:3eb1bd43:abf5d65729f9d1f18f8e11dd7b4b73385fea471594fae17e4a7353cf5a359f77")
    );
    std::fs::write(&key, "short").unwrap();
    let err = fails(
        &["stamp", "--key-file", key.to_str().unwrap(), "-f", "-"],
        Some(APP),
    );
    assert!(err.contains("at least 16 bytes"), "{err}");
}

#[test]
fn malformed_yaml_names_file_document_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.yaml");
    std::fs::write(
        &file,
        format!("{APP}---\nkind: ConfigMap\nmetadata:\n  name: [unclosed\n"),
    )
    .unwrap();
    let err = fails(&["stamp", "-f", file.to_str().unwrap()], None);
    assert!(err.contains("broken.yaml: document 3 (line"), "{err}");
    let line: usize = err
        .split("(line ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // The unclosed bracket is on the fourth line after the input's own lines.
    assert_eq!(line, APP.lines().count() + 4, "{err}");
}

#[test]
fn invalid_objects_get_clear_errors() {
    for (input, want) in [
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {PORT: 8080}\n",
            "document 1",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {k: a}\nbinaryData: {k: YQ==}\n",
            "in both data and binaryData",
        ),
        (
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {k: '!!notbase64'}\n",
            "Secret",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\ndata: {k: a}\n",
            "no metadata.name",
        ),
        ("- a\n- b\n", "must be a map"),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {template: {spec: {containers: 3}}}\n",
            "Deployment d: spec.template.spec.containers: invalid type",
        ),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
            "defined twice",
        ),
    ] {
        let err = fails(&["stamp", "--namespace", "default", "-f", "-"], Some(input));
        assert!(err.contains("standard input: document"), "{input}: {err}");
        assert!(err.contains(want), "{input}: want {want:?} in {err}");
    }
}

#[test]
fn unknown_kinds_jobs_and_comments_are_copied_unchanged() {
    let input = "# leading comment\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: once}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox, envFrom: [{configMapRef: {name: app-env}}]}]\n---   # a comment on the separator\napiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\nspec: {odd:   'spacing'}\n---\n";
    let (out, _) = ok(&["stamp", "-f", "-"], Some(input));
    assert_eq!(out, input);
}

#[test]
fn list_items_are_stamped_and_opted_out_workloads_are_not() {
    let input = "\
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: app-env}
    data: {LOG_LEVEL: info, PORT: \"8080\"}
  - apiVersion: apps/v1
    kind: StatefulSet
    metadata: {name: db}
    spec:
      template:
        spec:
          containers: [{name: db, image: postgres, envFrom: [{configMapRef: {name: app-env}}]}]
  - apiVersion: apps/v1
    kind: DaemonSet
    metadata: {name: agent, labels: {confighash.dev/enabled: \"false\"}}
    spec:
      template:
        spec:
          containers: [{name: a, image: agent, envFrom: [{configMapRef: {name: app-env}}]}]
";
    let (out, _) = ok(&["stamp", "--namespace", "default", "-f", "-"], Some(input));
    let list = yaml(&out);
    assert_eq!(stamp_of(&list["items"][1]), Some(VECTOR_1));
    assert_eq!(stamp_of(&list["items"][2]), None);
    assert_eq!(list["items"][0], yaml(input)["items"][0]);
}

#[test]
fn ignored_config_maps_are_left_out() {
    let ignored = APP.replacen(
        "  name: app-env\n",
        "  name: app-env\n  annotations: {confighash.dev/ignore: \"true\"}\n",
        1,
    );
    let (out, _) = ok(
        &["stamp", "--namespace", "default", "-f", "-"],
        Some(&ignored),
    );
    assert_eq!(
        stamp_of(&yaml(&documents(&out)[1])),
        Some("v2:plain:8a197cfb21e9aa6bbcf94cf7eae326632e2e20d00aa81064c1ed75590e8bf482"),
        "an ignored object counts as unreferenced (the no-reference vector)"
    );
}

#[test]
fn read_errors_name_the_path() {
    let err = fails(&["stamp", "-f", "does/not/exist.yaml"], None);
    assert!(err.contains("does/not/exist.yaml"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let err = fails(&["stamp", "-f", dir.path().to_str().unwrap()], None);
    assert!(err.contains("no .yaml, .yml or .json files"), "{err}");
    let err = fails(&["stamp", "-f", "-", "-f", "-"], Some(APP));
    assert!(err.contains("more than once"), "{err}");
    let out = confighash(&["stamp"], None);
    assert!(!out.status.success());
}

/// A rendered chart's StatefulSet, as charts write file modes: YAML 1.1 octal.
const CHART_STATEFUL_SET: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: redis-scripts
data:
  start.sh: echo start
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: redis
spec:
  serviceName: redis
  selector:
    matchLabels: {app: redis}
  template:
    metadata:
      labels: {app: redis}
    spec:
      containers:
        - name: redis
          image: redis
          volumeMounts:
            - {name: start-scripts, mountPath: /scripts}
      volumes:
        - name: config
          emptyDir: {}
        - name: data
          emptyDir: {}
        - name: start-scripts
          configMap:
            name: redis-scripts
            defaultMode: 0755
            items:
              - {key: start.sh, path: start.sh, mode: 0400}
";

#[test]
fn file_modes_written_in_octal_read_as_kubectl_reads_them() {
    let (out, _) = ok(
        &["stamp", "--namespace", "default", "-f", "-"],
        Some(CHART_STATEFUL_SET),
    );
    assert!(out.contains("confighash.dev/checksum: v2:plain:"), "{out}");
    // 0755 is 493 and 0400 is 256, as kubectl sends them.
    assert!(out.contains("defaultMode: 493"), "{out}");
    assert!(out.contains("mode: 256"), "{out}");
}

#[test]
fn a_value_of_the_wrong_type_is_named_by_its_field_path_and_line() {
    let input = CHART_STATEFUL_SET.replace("defaultMode: 0755", "defaultMode: 1.5");
    let err = fails(
        &["stamp", "--namespace", "default", "-f", "-"],
        Some(&input),
    );
    // The file, the document, its line of the field, the kind and name, the field path.
    assert!(
        err.contains("standard input: document 2 (line 33): StatefulSet redis: spec.template.spec.volumes[2].configMap.defaultMode: invalid type: floating point `1.5`, expected i32"),
        "{err}"
    );
    assert!(!err.contains("line 0"), "{err}");
    assert!(!err.to_lowercase().contains("option"), "{err}");
    // In a ConfigMap too.
    let err = fails(
        &["stamp", "--namespace", "default", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: x\n  PORT: 8080\n",
        ),
    );
    assert!(
        err.contains("document 1 (line 7): ConfigMap c: data.PORT: invalid type: integer `8080`, expected a string"),
        "{err}"
    );
}

#[test]
fn lists_of_any_kind_are_read_item_by_item() {
    for kind in ["List", "DeploymentList"] {
        let input = format!(
            "apiVersion: v1\nkind: {kind}\nitems:\n  - apiVersion: v1\n    kind: ConfigMap\n    metadata: {{name: app-env}}\n    data: {{A: b}}\n  - apiVersion: apps/v1\n    kind: Deployment\n    metadata: {{name: web}}\n    spec:\n      selector: {{matchLabels: {{app: web}}}}\n      template:\n        metadata: {{labels: {{app: web}}}}\n        spec:\n          containers: [{{name: c, image: i, envFrom: [{{configMapRef: {{name: app-env}}}}]}}]\n"
        );
        let (out, _) = ok(
            &["stamp", "--namespace", "default", "-f", "-"],
            Some(&input),
        );
        assert!(
            out.contains("confighash.dev/checksum: v2:plain:"),
            "{kind}: {out}"
        );
        // An error inside an item names its line.
        let bad = input.replace(
            "containers: [{name: c, image: i,",
            "containers: [{name: 7, image: i,",
        );
        let err = fails(&["stamp", "--namespace", "default", "-f", "-"], Some(&bad));
        assert!(
            err.contains("(line 16)")
                && err.contains("Deployment web: spec.template.spec.containers[0].name"),
            "{kind}: {err}"
        );
    }
}

#[test]
fn an_opted_out_workload_is_copied_byte_for_byte_even_when_its_pod_spec_would_not_parse() {
    let input = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: legacy\n  labels: {confighash.dev/enabled: \"false\"}\nspec:\n  template:\n    spec:\n      containers: 3   # odd, but not ours\n";
    let (out, _) = ok(&["stamp", "--namespace", "default", "-f", "-"], Some(input));
    assert_eq!(out, input);
    let (report, _) = ok(
        &["stamp", "--explain", "--namespace", "default", "-f", "-"],
        Some(input),
    );
    assert!(
        report.contains("skipped: labelled confighash.dev/enabled=false"),
        "{report}"
    );
}

#[test]
fn a_key_given_twice_keeps_its_last_value_with_a_warning() {
    let input = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  A: one\n  A: two\n";
    let (out, err) = ok(&["stamp", "--namespace", "default", "-f", "-"], Some(input));
    assert_eq!(out, input);
    assert!(
        err.contains("document 1 (line 6): the key \"A\" is given twice"),
        "{err}"
    );
}
