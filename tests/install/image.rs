//! The image built without a registry (`scripts/build-image.sh`, used by the real-node tier) and
//! the Dockerfile's runtime stage (what the release builds) are one image: the same user,
//! entrypoint, ports and labels. The Dockerfile is read here on its own, not with the script's
//! reading of it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The runtime stage's settings, read from the Dockerfile: (user, entrypoint, ports, labels).
fn dockerfile_runtime() -> (String, Vec<String>, Vec<String>, BTreeMap<String, String>) {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile"))
        .expect("read the Dockerfile");
    let joined = text.replace("\\\n", " ");
    let lines: Vec<&str> = joined.lines().collect();
    let last_from = lines
        .iter()
        .rposition(|l| l.trim_start().to_ascii_uppercase().starts_with("FROM "))
        .expect("a FROM line");
    let (mut user, mut entrypoint, mut ports) = (String::new(), Vec::new(), Vec::new());
    let (mut args, mut labels) = (BTreeMap::new(), BTreeMap::new());
    for line in &lines[last_from + 1..] {
        let line = line.trim();
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "ARG" => {
                let (name, value) = rest.trim().split_once('=').unwrap_or((rest.trim(), ""));
                args.insert(name.to_owned(), value.to_owned());
            }
            "USER" => rest.trim().clone_into(&mut user),
            "EXPOSE" => ports.extend(rest.split_whitespace().map(|p| format!("{p}/tcp"))),
            "ENTRYPOINT" => entrypoint = serde_json::from_str(rest).expect("ENTRYPOINT as JSON"),
            "LABEL" => {
                // key="value" pairs, the values quoted.
                let mut rest = rest.trim();
                while let Some((key, after)) = rest.split_once("=\"") {
                    let (value, tail) = after.split_once('"').expect("a closing quote");
                    let value = args.iter().fold(value.to_owned(), |v, (name, arg)| {
                        v.replace(&format!("${name}"), arg)
                    });
                    labels.insert(key.trim().to_owned(), value);
                    rest = tail.trim();
                }
            }
            _ => {}
        }
    }
    (user, entrypoint, ports, labels)
}

#[test]
fn the_image_built_here_has_the_dockerfiles_user_entrypoint_ports_and_labels() {
    for tool in ["python3", "ldd", "tar"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            eprintln!("skipped: {tool} is not on this machine (scripts/build-image.sh needs it)");
            return;
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("image.tar");
    // Any dynamically linked program stands in for the release binary.
    let binary = std::fs::canonicalize("/bin/sh").unwrap();
    let out = Command::new("bash")
        .arg(root.join("scripts/build-image.sh"))
        .args(["--tag", "test", "--repository", "example.test/confighash"])
        .arg("--binary")
        .arg(&binary)
        .arg("--out")
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "build-image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unpacked = dir.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    assert!(
        Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&unpacked)
            .status()
            .unwrap()
            .success()
    );
    let read = |p: &str| -> Value {
        serde_json::from_slice(&std::fs::read(unpacked.join(p)).unwrap()).unwrap()
    };
    // Docker's manifest and the OCI index name the same image.
    let docker = read("manifest.json");
    assert_eq!(docker[0]["RepoTags"][0], "example.test/confighash:test");
    let index = read("index.json");
    assert_eq!(
        index["manifests"][0]["annotations"]["io.containerd.image.name"],
        "example.test/confighash:test"
    );
    let config = read(docker[0]["Config"].as_str().unwrap());
    let c = &config["config"];
    let (user, entrypoint, ports, labels) = dockerfile_runtime();
    assert_eq!(c["User"], user.as_str(), "USER");
    assert_eq!(c["Entrypoint"], serde_json::json!(entrypoint), "ENTRYPOINT");
    let mut exposed: Vec<&String> = c["ExposedPorts"].as_object().unwrap().keys().collect();
    exposed.sort();
    let mut want: Vec<&String> = ports.iter().collect();
    want.sort();
    assert_eq!(exposed, want, "EXPOSE");
    assert!(!labels.is_empty(), "the Dockerfile has labels");
    let got: BTreeMap<String, String> =
        serde_json::from_value(c["Labels"].clone()).expect("labels");
    assert_eq!(got, labels, "LABEL");
    // The layer holds the program where the entrypoint runs it, and its loader.
    let layer = unpacked.join(docker[0]["Layers"][0].as_str().unwrap());
    let listing = Command::new("tar")
        .arg("-tvf")
        .arg(&layer)
        .output()
        .unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    let entry = entrypoint[0].trim_start_matches('/');
    assert!(
        listing
            .lines()
            .any(|l| l.ends_with(&format!(" {entry}")) && l.starts_with("-rwxr-xr-x")),
        "{entry} executable in the layer:\n{listing}"
    );
    for file in [
        "etc/passwd",
        "etc/group",
        "etc/ssl/certs/ca-certificates.crt",
        "tmp/",
    ] {
        assert!(
            listing.lines().any(|l| l.ends_with(&format!(" {file}"))),
            "{file} in the layer"
        );
    }
    assert!(
        listing.lines().any(|l| l.contains("ld-linux")),
        "the dynamic loader in the layer"
    );
}
