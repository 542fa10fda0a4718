//! The job's secret and the mutual challenge and response that proves it: each side sends a
//! fresh 32-byte nonce and proves it holds the secret by an HMAC-SHA256 over both nonces, under
//! a label of its role, so neither a recorded exchange (the nonces are fresh) nor a proof sent
//! back to its maker (the labels differ) passes. The secret itself never travels. Pure: the
//! server's connection handling, the client and the rendezvous carry the messages.

use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Bytes of a nonce and of a proof.
pub const LEN: usize = 32;

/// Shortest and longest secret accepted, in bytes.
const SECRET_BYTES: std::ops::RangeInclusive<u64> = 16..=4096;

/// A job's shared secret (never printed: its `Debug` shows only its length).
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// A fresh random nonce.
pub fn nonce() -> [u8; LEN] {
    let mut n = [0u8; LEN];
    getrandom::fill(&mut n).expect("the operating system's random source is available");
    n
}

impl Secret {
    /// A new random secret (64 hex digits, so the file is text).
    pub fn generate() -> Secret {
        Secret(to_hex(&nonce()).into_bytes())
    }

    /// The secret in `path`: a regular file (a link to one is followed: Kubernetes mounts
    /// secrets as links) of 16 to 4096 bytes that only its owner may read or write;
    /// surrounding whitespace is not part of it.
    pub fn read(path: &Path) -> anyhow::Result<Secret> {
        let bytes = crate::state_file::read_private(path, *SECRET_BYTES.end()).map_err(|e| {
            anyhow::anyhow!("secret file {}: {}; a secret takes 16 to 4096 bytes", path.display(), e.reason())
        })?;
        let secret = bytes.trim_ascii().to_vec();
        anyhow::ensure!(
            SECRET_BYTES.contains(&(secret.len() as u64)),
            "secret file {}: {} bytes besides whitespace, a secret takes 16 to 4096",
            path.display(),
            secret.len()
        );
        Ok(Secret(secret))
    }

    /// Writes this secret into a new file at `path` that only its owner may read.
    pub fn write_new(&self, path: &Path) -> anyhow::Result<()> {
        crate::state_file::write_new(path, &self.0, 0o600)
            .map_err(|e| anyhow::anyhow!("cannot create the secret file: {e}"))
    }

    /// The secret's bytes, for a launcher that hands it on (a Kubernetes Secret).
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self, label: &[u8], first: &[u8; LEN], second: &[u8; LEN]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(label);
        mac.update(first);
        mac.update(second);
        mac
    }

    /// The server's proof for a client's nonce and its own.
    pub fn server_proof(&self, client: &[u8; LEN], server: &[u8; LEN]) -> [u8; LEN] {
        self.mac(b"oar server proof", client, server).finalize().into_bytes().into()
    }

    /// The client's proof for the server's nonce and its own.
    pub fn client_proof(&self, server: &[u8; LEN], client: &[u8; LEN]) -> [u8; LEN] {
        self.mac(b"oar client proof", server, client).finalize().into_bytes().into()
    }

    /// Whether `proof` is the server's for these nonces (compared in constant time).
    pub fn is_server_proof(&self, client: &[u8; LEN], server: &[u8; LEN], proof: &[u8]) -> bool {
        self.mac(b"oar server proof", client, server).verify_slice(proof).is_ok()
    }

    /// Whether `proof` is the client's for these nonces (compared in constant time).
    pub fn is_client_proof(&self, server: &[u8; LEN], client: &[u8; LEN], proof: &[u8]) -> bool {
        self.mac(b"oar client proof", server, client).verify_slice(proof).is_ok()
    }
}

/// `bytes` as lower-case hex (the rendezvous's JSON lines, digests in manifests and calendars).
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `LEN` bytes from their hex text, if that is what `text` is.
pub fn from_hex(text: &str) -> Option<[u8; LEN]> {
    if text.len() != 2 * LEN || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; LEN];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_check_only_with_the_same_secret_nonces_and_role() {
        let (a, b) = (Secret::generate(), Secret::generate());
        let (c, s) = (nonce(), nonce());
        assert_ne!(c, s, "fresh nonces");
        let proof = a.server_proof(&c, &s);
        assert!(a.is_server_proof(&c, &s, &proof));
        assert!(!b.is_server_proof(&c, &s, &proof), "another secret");
        assert!(!a.is_server_proof(&nonce(), &s, &proof), "another client nonce: a replay");
        assert!(!a.is_client_proof(&s, &c, &proof), "a server's proof reflected as a client's");
        let client = a.client_proof(&s, &c);
        assert!(a.is_client_proof(&s, &c, &client));
        assert!(!a.is_client_proof(&s, &c, &client[..31]), "a short proof");
        assert!(!format!("{a:?}").contains(std::str::from_utf8(a.bytes()).unwrap()), "Debug hides it");
        assert_eq!(from_hex(&to_hex(&proof)), Some(proof));
        assert_eq!(from_hex("zz"), None);
    }

    #[test]
    fn secret_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        let s = Secret::generate();
        s.write_new(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(Secret::read(&path).unwrap().bytes(), s.bytes());
        assert!(s.write_new(&path).is_err(), "never overwritten");
        let private = |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(dir.path().join("short"), "too short\n").unwrap();
        private(&dir.path().join("short"));
        let e = Secret::read(&dir.path().join("short")).unwrap_err().to_string();
        assert!(e.contains("a secret takes 16 to 4096"), "{e}");
        // Readable by others: refused, as ssh refuses such a key.
        let open = dir.path().join("open");
        std::fs::write(&open, s.bytes()).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Secret::read(&open).unwrap_err().to_string();
        assert!(e.contains("others than its owner may read or write it (mode 644): make it private"), "{e}");
        private(&open);
        assert_eq!(Secret::read(&open).unwrap().bytes(), s.bytes());
        let e = Secret::read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
