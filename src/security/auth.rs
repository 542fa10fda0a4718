//! The job's secret, the credentials derived from it, and the mutual challenge and response
//! that proves them: each side sends a fresh 32-byte nonce and proves it holds the key by an
//! HMAC-SHA256 over both nonces and over what the proof is for (the job, the identity the
//! client proves, the index of the server it dialed and that server's epoch), under a label of
//! its role. So neither a recorded exchange (the nonces are fresh), nor a proof sent back to its
//! maker (the labels differ), nor one relayed to another server of the job (the index differs),
//! nor one for another identity passes. No key ever travels.
//!
//! The job's master secret stays with the servers and whoever starts the job. Every other
//! process gets a credential, a key derived from the master for one identity: trainer t of job
//! J, a tool of J (it only reads) or an operator of J (shrinks, saves, admin). A server, holding
//! the master, derives the key of the identity a client claims, so the identity a connection
//! acts for is proven, never declared. A process given the master itself may act as any
//! identity, as before credentials existed (insiders are then not told apart). Pure: the
//! server's connection handling, the client and the rendezvous carry the messages.

use std::path::Path;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Bytes of a nonce and of a proof.
pub const LEN: usize = 32;

/// Shortest and longest secret accepted, in bytes.
const SECRET_BYTES: std::ops::RangeInclusive<u64> = 16..=4096;

/// The first line of a credential file.
const CREDENTIAL_MAGIC: &str = "oar-credential 1";

/// Who a process is in its job, as its key proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// The holder of the job's master secret: any identity (servers, launchers, and processes
    /// started the way they were before credentials).
    Master,
    /// Trainer t: acts for t only.
    Trainer(u64),
    /// A tool: reads (pulls of existing rows, stats), changes nothing.
    Tool,
    /// An operator: shrinks the tables, saves, claims a server's replacement.
    Operator,
}

impl Identity {
    /// Its wire form: a kind and a number.
    pub fn code(self) -> (u64, u64) {
        match self {
            Identity::Master => (0, 0),
            Identity::Trainer(t) => (1, t),
            Identity::Tool => (2, 0),
            Identity::Operator => (3, 0),
        }
    }

    /// The identity of a wire form, if it is one.
    pub fn from_code(kind: u64, n: u64) -> Option<Identity> {
        match (kind, n) {
            (0, 0) => Some(Identity::Master),
            (1, t) => Some(Identity::Trainer(t)),
            (2, 0) => Some(Identity::Tool),
            (3, 0) => Some(Identity::Operator),
            _ => None,
        }
    }

    /// How files and messages name it: `trainer 3`, `tool`, `operator`, `master`.
    pub fn label(self) -> String {
        match self {
            Identity::Master => "master".into(),
            Identity::Trainer(t) => format!("trainer {t}"),
            Identity::Tool => "tool".into(),
            Identity::Operator => "operator".into(),
        }
    }

    /// The identity `text` names (as [`label`](Self::label) writes it).
    pub fn parse(text: &str) -> Option<Identity> {
        match text.trim() {
            "master" => Some(Identity::Master),
            "tool" => Some(Identity::Tool),
            "operator" => Some(Identity::Operator),
            t => t.strip_prefix("trainer ").and_then(|n| n.trim().parse().ok()).map(Identity::Trainer),
        }
    }
}

/// What a proof is for, besides the two nonces: both sides must agree on every field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim<'a> {
    /// The job id.
    pub job: &'a str,
    /// The identity the client proves.
    pub identity: Identity,
    /// The server's index in the job (the one the client dialed), or [`RENDEZVOUS`].
    pub server: u64,
    /// The server's epoch (its incarnation), as the server tells it.
    pub epoch: u64,
}

/// The `server` of a [`Claim`] made to a rendezvous rather than a parameter server.
pub const RENDEZVOUS: u64 = u64::MAX;

/// A job's master secret, or a credential derived from it for one identity (never printed: its
/// `Debug` shows only what it is).
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
    /// `None` for the master; else the job and identity the credential is for.
    credential: Option<(String, Identity)>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.credential {
            None => write!(f, "Secret(master, {} bytes)", self.key.len()),
            Some((job, identity)) => write!(f, "Secret(credential of {} of job {job})", identity.label()),
        }
    }
}

/// A fresh random nonce.
pub fn nonce() -> [u8; LEN] {
    let mut n = [0u8; LEN];
    getrandom::fill(&mut n).expect("the operating system's random source is available");
    n
}

impl Secret {
    /// A new random master secret (64 hex digits, so the file is text).
    pub fn generate() -> Secret {
        Secret { key: to_hex(&nonce()).into_bytes(), credential: None }
    }

    /// The secret in `path`: a regular file (a link to one is followed: Kubernetes mounts
    /// secrets as links) that only its owner may read or write, holding a master secret (16 to
    /// 4096 bytes; surrounding whitespace is not part of it) or a credential (its first line
    /// `oar-credential 1`, written by [`Secret::write_new`] of a derived one).
    pub fn read(path: &Path) -> anyhow::Result<Secret> {
        let bytes = crate::base::state_file::read_private(path, *SECRET_BYTES.end()).map_err(|e| {
            anyhow::anyhow!("secret file {}: {}; a secret takes 16 to 4096 bytes", path.display(), e.reason())
        })?;
        if bytes.starts_with(CREDENTIAL_MAGIC.as_bytes()) {
            return Secret::parse_credential(&bytes)
                .map_err(|why| anyhow::anyhow!("credential file {}: {why}", path.display()));
        }
        let secret = bytes.trim_ascii().to_vec();
        anyhow::ensure!(
            SECRET_BYTES.contains(&(secret.len() as u64)),
            "secret file {}: {} bytes besides whitespace, a secret takes 16 to 4096",
            path.display(),
            secret.len()
        );
        Ok(Secret { key: secret, credential: None })
    }

    /// A credential file's content.
    fn parse_credential(bytes: &[u8]) -> Result<Secret, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not text".to_string())?;
        let mut lines = text.lines().skip(1);
        let mut field = |name: &str| -> Result<String, String> {
            let line = lines.next().ok_or_else(|| format!("no '{name}:' line"))?;
            let value = line.strip_prefix(name).and_then(|l| l.strip_prefix(':'));
            value.map(|v| v.trim().to_string()).ok_or_else(|| format!("expected '{name}:', found {line:?}"))
        };
        let job = field("job")?;
        let identity = field("identity")?;
        let identity = Identity::parse(&identity).filter(|i| *i != Identity::Master);
        let identity = identity.ok_or("the identity is not 'trainer N', 'tool' or 'operator'")?;
        let key = from_hex(&field("key")?).ok_or("the key is not 64 hex digits")?;
        Ok(Secret { key: key.to_vec(), credential: Some((job, identity)) })
    }

    /// Writes this secret (the master's bytes, or a credential's file) into a new file at
    /// `path` that only its owner may read.
    pub fn write_new(&self, path: &Path) -> anyhow::Result<()> {
        crate::base::state_file::write_new(path, &self.bytes(), 0o600)
            .map_err(|e| anyhow::anyhow!("cannot create the secret file: {e}"))
    }

    /// The file's bytes, for a launcher that hands it on (a Kubernetes Secret).
    pub fn bytes(&self) -> Vec<u8> {
        match &self.credential {
            None => self.key.clone(),
            Some((job, identity)) => {
                format!("{CREDENTIAL_MAGIC}\njob: {job}\nidentity: {}\nkey: {}\n", identity.label(), to_hex(&self.key))
                    .into_bytes()
            }
        }
    }

    /// Whether this is the job's master secret (else a credential).
    pub fn is_master(&self) -> bool {
        self.credential.is_none()
    }

    /// The identity this secret proves: [`Identity::Master`] for the master.
    pub fn identity(&self) -> Identity {
        self.credential.as_ref().map_or(Identity::Master, |(_, i)| *i)
    }

    /// The job a credential is for (`None` for the master: any job it is given to).
    pub fn job(&self) -> Option<&str> {
        self.credential.as_ref().map(|(j, _)| j.as_str())
    }

    /// The credential of `identity` in job `job`, derived from this master secret.
    pub fn derive(&self, job: &str, identity: Identity) -> anyhow::Result<Secret> {
        anyhow::ensure!(self.is_master(), "a credential is derived from the job's master secret, not from another");
        anyhow::ensure!(identity != Identity::Master, "the master is not derived");
        Ok(Secret { key: self.key_of(job, identity).to_vec(), credential: Some((job.to_string(), identity)) })
    }

    /// The key of `identity` in `job` (the master's own bytes for [`Identity::Master`]).
    fn key_of(&self, job: &str, identity: Identity) -> Vec<u8> {
        if identity == Identity::Master {
            return self.key.clone();
        }
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        for part in [b"oar credential".as_slice(), job.as_bytes(), identity.label().as_bytes()] {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().to_vec()
    }

    /// The key a proof for `claim` takes: a server (the master) derives the claimed identity's;
    /// a credential has only its own. `None` when this secret cannot prove `claim`.
    fn key_for(&self, claim: &Claim) -> Option<Vec<u8>> {
        match &self.credential {
            None => Some(self.key_of(claim.job, claim.identity)),
            Some((job, identity)) => (job == claim.job && *identity == claim.identity).then(|| self.key.clone()),
        }
    }

    fn mac(&self, label: &[u8], claim: &Claim, first: &[u8; LEN], second: &[u8; LEN]) -> Option<Hmac<Sha256>> {
        let key = self.key_for(claim)?;
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key).expect("HMAC takes keys of any length");
        let (kind, n) = claim.identity.code();
        mac.update(label);
        mac.update(&(claim.job.len() as u64).to_le_bytes());
        mac.update(claim.job.as_bytes());
        for x in [kind, n, claim.server, claim.epoch] {
            mac.update(&x.to_le_bytes());
        }
        mac.update(first);
        mac.update(second);
        Some(mac)
    }

    /// The server's proof for `claim`, a client's nonce and its own (`None` if this secret
    /// cannot make it).
    pub fn server_proof(&self, claim: &Claim, client: &[u8; LEN], server: &[u8; LEN]) -> Option<[u8; LEN]> {
        Some(self.mac(b"oar server proof", claim, client, server)?.finalize().into_bytes().into())
    }

    /// The client's proof for `claim`, the server's nonce and its own.
    pub fn client_proof(&self, claim: &Claim, server: &[u8; LEN], client: &[u8; LEN]) -> Option<[u8; LEN]> {
        Some(self.mac(b"oar client proof", claim, server, client)?.finalize().into_bytes().into())
    }

    /// Whether `proof` is the server's for `claim` and these nonces (in constant time).
    pub fn is_server_proof(&self, claim: &Claim, client: &[u8; LEN], server: &[u8; LEN], proof: &[u8]) -> bool {
        self.mac(b"oar server proof", claim, client, server).is_some_and(|m| m.verify_slice(proof).is_ok())
    }

    /// Whether `proof` is the client's for `claim` and these nonces (in constant time).
    pub fn is_client_proof(&self, claim: &Claim, server: &[u8; LEN], client: &[u8; LEN], proof: &[u8]) -> bool {
        self.mac(b"oar client proof", claim, server, client).is_some_and(|m| m.verify_slice(proof).is_ok())
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
    fn proofs_check_only_with_the_same_key_nonces_role_job_identity_server_and_epoch() {
        let (a, b) = (Secret::generate(), Secret::generate());
        let (c, s) = (nonce(), nonce());
        assert_ne!(c, s, "fresh nonces");
        let claim = Claim { job: "j", identity: Identity::Master, server: 0, epoch: 0 };
        let proof = a.server_proof(&claim, &c, &s).unwrap();
        assert!(a.is_server_proof(&claim, &c, &s, &proof));
        assert!(!b.is_server_proof(&claim, &c, &s, &proof), "another secret");
        assert!(!a.is_server_proof(&claim, &nonce(), &s, &proof), "another client nonce: a replay");
        assert!(!a.is_client_proof(&claim, &s, &c, &proof), "a server's proof reflected as a client's");
        for other in [
            Claim { job: "k", ..claim },
            Claim { server: 1, ..claim },
            Claim { epoch: 1, ..claim },
            Claim { identity: Identity::Tool, ..claim },
            Claim { server: RENDEZVOUS, ..claim },
        ] {
            assert!(!a.is_server_proof(&other, &c, &s, &proof), "{other:?}: relayed or for another");
        }
        let client = a.client_proof(&claim, &s, &c).unwrap();
        assert!(a.is_client_proof(&claim, &s, &c, &client));
        assert!(!a.is_client_proof(&claim, &s, &c, &client[..31]), "a short proof");
        assert!(!format!("{a:?}").contains(std::str::from_utf8(&a.bytes()).unwrap()), "Debug hides it");
        assert_eq!(from_hex(&to_hex(&proof)), Some(proof));
        assert_eq!(from_hex("zz"), None);
    }

    /// A trainer's credential proves that trainer of that job to a server holding the master,
    /// and nothing else: not another trainer, not another job, not the master.
    #[test]
    fn a_credential_proves_its_own_identity_only() {
        let master = Secret::generate();
        let t1 = master.derive("j", Identity::Trainer(1)).unwrap();
        assert_eq!((t1.identity(), t1.job(), t1.is_master()), (Identity::Trainer(1), Some("j"), false));
        let (c, s) = (nonce(), nonce());
        let claim = Claim { job: "j", identity: Identity::Trainer(1), server: 2, epoch: 3 };
        let proof = t1.client_proof(&claim, &s, &c).unwrap();
        assert!(master.is_client_proof(&claim, &s, &c, &proof), "the server derives the same key");
        assert!(t1.is_server_proof(&claim, &c, &s, &master.server_proof(&claim, &c, &s).unwrap()));
        for other in [Identity::Trainer(0), Identity::Master, Identity::Tool, Identity::Operator] {
            assert_eq!(t1.client_proof(&Claim { identity: other, ..claim }, &s, &c), None, "{other:?}");
            assert!(!master.is_client_proof(&Claim { identity: other, ..claim }, &s, &c, &proof));
        }
        assert_eq!(t1.client_proof(&Claim { job: "k", ..claim }, &s, &c), None, "another job");
        assert!(t1.derive("j", Identity::Trainer(0)).is_err(), "a credential derives nothing");
        assert_ne!(master.derive("k", Identity::Trainer(1)).unwrap().key, t1.key, "another job, another key");
        // A credential's file round-trips, and names what it is for.
        let dir = tempfile::tempdir().unwrap();
        t1.write_new(&dir.path().join("t1")).unwrap();
        let back = Secret::read(&dir.path().join("t1")).unwrap();
        assert_eq!((back.key.clone(), back.identity(), back.job()), (t1.key.clone(), Identity::Trainer(1), Some("j")));
        assert_eq!(format!("{back:?}"), "Secret(credential of trainer 1 of job j)");
        for (label, identity) in
            [("trainer 7", Identity::Trainer(7)), ("tool", Identity::Tool), ("operator", Identity::Operator)]
        {
            assert_eq!(Identity::parse(label), Some(identity));
            assert_eq!(Identity::from_code(identity.code().0, identity.code().1), Some(identity));
        }
        assert_eq!(Identity::from_code(2, 5), None);
        let bad = dir.path().join("bad");
        crate::base::state_file::write_new(&bad, b"oar-credential 1\njob: j\nidentity: master\nkey: 00\n", 0o600)
            .unwrap();
        let e = Secret::read(&bad).unwrap_err().to_string();
        assert!(e.contains("the identity is not 'trainer N', 'tool' or 'operator'"), "{e}");
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
