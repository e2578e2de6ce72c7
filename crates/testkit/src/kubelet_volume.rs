//! A Secret volume laid out the way kubelet's atomic writer lays it out, holding a serving pair:
//! `..<timestamp>/` holds `tls.crt` and `tls.key`, `..data` links to it, and each file name links
//! through `..data`. Shared by the TLS reload tests and the load run.

use std::path::{Path, PathBuf};

pub struct SecretVolume {
    dir: tempfile::TempDir,
    /// The `..<timestamp>` directory `..data` points at.
    current: String,
    generation: u32,
}

impl SecretVolume {
    /// A volume in a new temporary directory, holding `cert_pem` and `key_pem`.
    pub fn new(cert_pem: &str, key_pem: &str) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let current = generation_dir(0);
        write_pair(&dir.path().join(&current), cert_pem, key_pem);
        std::os::unix::fs::symlink(&current, dir.path().join("..data")).expect("..data");
        for name in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.path().join(name))
                .expect("a file link");
        }
        SecretVolume {
            dir,
            current,
            generation: 0,
        }
    }

    /// The path a pod would read the certificate from.
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    /// The path a pod would read the key from.
    pub fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }

    /// What kubelet does when the Secret changes: write a new timestamped directory, point a
    /// temporary link at it, rename that link over `..data` (the one atomic step), then remove
    /// the old directory.
    pub fn update(&mut self, cert_pem: &str, key_pem: &str) {
        let root = self.dir.path();
        self.generation += 1;
        let next = generation_dir(self.generation);
        write_pair(&root.join(&next), cert_pem, key_pem);
        std::os::unix::fs::symlink(&next, root.join("..data_tmp")).expect("..data_tmp");
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).expect("swap ..data");
        std::fs::remove_dir_all(root.join(&self.current)).expect("remove the old generation");
        self.current = next;
    }
}

fn generation_dir(generation: u32) -> String {
    format!("..2026_01_01_00_00_00.{generation:09}")
}

fn write_pair(dir: &Path, cert_pem: &str, key_pem: &str) {
    std::fs::create_dir_all(dir).expect("create the generation directory");
    std::fs::write(dir.join("tls.crt"), cert_pem).expect("write tls.crt");
    std::fs::write(dir.join("tls.key"), key_pem).expect("write tls.key");
}
