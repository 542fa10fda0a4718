//! Optional TLS for the traffic between trainers and servers (rustls): the servers' and the
//! clients' configurations from PEM files, and `oar tls` making a job's certificate
//! authority and server certificate.
//!
//! TLS adds what the secret's challenge and response (see [`crate::security::auth`]) does not give:
//! frames that nobody on the path can read or change. Every server presents one certificate
//! issued for a name (`oar` unless told otherwise), not for its address, so one certificate
//! serves a job whose servers move between hosts; clients check it against the job's
//! certificate authority and that name.
//! The secret's handshake still runs inside TLS: TLS says the server is the job's, the secret
//! says the client is.
//!
//! PEM files are read as regular files of at most 1 MiB, links followed (Kubernetes mounts its
//! Secrets through them), a private key only if no one but its owner may read it; rustls parses
//! them (`pki-types`). rustls runs with the `ring` provider, which `ureq` already brings, so no C
//! toolchain is needed for aws-lc: `tokio-rustls` on the server, rustls's blocking `StreamOwned`
//! in the trainer. [`generate`] makes a job's certificate authority and one server certificate
//! with `rcgen`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The name in the server certificate that clients check when told no other.
pub const DEFAULT_NAME: &str = "oar";

/// The largest PEM file read: certificates and keys are a few kilobytes.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("TLS file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS: {0}")]
    Config(String),
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File { path: path.to_path_buf(), reason: reason.to_string() }
}

/// Reads a PEM file: a regular file (Kubernetes mounts Secrets through links, so links are
/// followed) of at most 1 MiB.
fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::base::state_file::read_named(path, MAX_PEM_BYTES).map_err(|e| file_error(path, e.reason()))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(path)?;
    let certs: Vec<_> =
        CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no CERTIFICATE in it"));
    }
    Ok(certs)
}

/// What a server needs for TLS: its certificate chain and private key.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificates(cert)?;
    // The private key, like the job's secret, must be its owner's alone.
    let key_pem = crate::base::state_file::read_private(key, MAX_PEM_BYTES).map_err(|e| file_error(key, e.reason()))?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| file_error(key, e))?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| TlsError::Config(format!("{} and {}: {e}", cert.display(), key.display())))?;
    Ok(Arc::new(config))
}

/// What a client needs for TLS: the certificate authority that issued the servers'
/// certificate, and the name that certificate must be for.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// rustls's client configuration, trusting only the job's authority.
    pub config: Arc<rustls::ClientConfig>,
    /// The name checked in every server's certificate.
    pub name: ServerName<'static>,
}

/// A client's TLS from the authority's PEM file and the servers' certificate name.
pub fn client_config(ca: &Path, name: &str) -> Result<ClientTls, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca)? {
        roots.add(cert).map_err(|e| file_error(ca, e))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(name.to_string())
        .map_err(|e| TlsError::Config(format!("server certificate name {name:?}: {e}")))?;
    Ok(ClientTls { config: Arc::new(config), name })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The files [`generate`] writes.
#[derive(Clone, Debug)]
pub struct Generated {
    /// The authority's certificate: what clients trust (`--tls-ca`).
    pub ca: PathBuf,
    /// The servers' certificate (`--tls-cert`).
    pub cert: PathBuf,
    /// The servers' private key (`--tls-key`), readable by its owner only.
    pub key: PathBuf,
}

/// Makes a job's certificate authority and one server certificate for `name` issued by it,
/// written as `ca.pem`, `cert.pem` and `key.pem` into `dir`. The authority's own key is not
/// kept: nothing else can be issued by it, so trusting it trusts only this certificate.
pub fn generate(dir: &Path, name: &str) -> Result<Generated, TlsError> {
    // A name clients cannot check (`a b`, empty, a line break) made a certificate no trainer
    // could connect with, found only when one tried.
    ServerName::try_from(name.to_string()).map_err(|e| TlsError::Config(format!("--name {name:?}: {e}")))?;
    let files = Generated { ca: dir.join("ca.pem"), cert: dir.join("cert.pem"), key: dir.join("key.pem") };
    // All three are new or none is written: a key left from another run beside a new
    // certificate would not match it.
    if let Some(there) = [&files.ca, &files.cert, &files.key].into_iter().find(|p| std::fs::symlink_metadata(p).is_ok())
    {
        return Err(TlsError::Config(format!(
            "{} is already there: oar tls writes ca.pem, cert.pem and key.pem anew; use an empty folder",
            there.display()
        )));
    }
    let fail = |e: rcgen::Error| TlsError::Config(format!("making a certificate: {e}"));
    let ca_key = rcgen::KeyPair::generate().map_err(fail)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, format!("oar job authority for {name}"));
    let ca_cert = ca_params.self_signed(&ca_key).map_err(fail)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().map_err(fail)?;
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).map_err(fail)?;
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let cert = params.signed_by(&key, &issuer).map_err(fail)?;
    std::fs::create_dir_all(dir).map_err(|e| file_error(dir, e))?;
    let write = |path: &Path, text: String, mode| {
        crate::base::state_file::write_new(path, text.as_bytes(), mode).map_err(|e| file_error(path, e))
    };
    write(&files.ca, ca_cert.pem(), 0o644)?;
    write(&files.cert, cert.pem(), 0o644)?;
    write(&files.key, key.serialize_pem(), 0o600)?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_files_make_configurations_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate(dir.path(), "oar").unwrap();
        server_config(&files.cert, &files.key).unwrap();
        client_config(&files.ca, "oar").unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&files.key).unwrap().permissions().mode() & 0o777, 0o600);
        // Not over existing files, nor beside one of them: nothing written.
        assert!(generate(dir.path(), "oar").unwrap_err().to_string().contains("ca.pem"));
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("key.pem"), "old").unwrap();
        let e = generate(other.path(), "oar").unwrap_err().to_string();
        assert!(e.contains("key.pem is already there"), "{e}");
        assert!(!other.path().join("ca.pem").exists() && !other.path().join("cert.pem").exists());
        // A name no client can check is refused before anything is made.
        for bad in ["a b", "", "x\ny"] {
            let e = generate(&other.path().join("n"), bad).unwrap_err().to_string();
            assert!(e.contains("--name"), "{e}");
        }
        assert!(!other.path().join("n").exists());
        generate(&other.path().join("ip"), "127.0.0.1").unwrap();
        // A key where the certificate belongs, a directory, a missing file.
        let e = server_config(&files.key, &files.key).unwrap_err().to_string();
        assert!(e.contains("key.pem") && e.contains("no CERTIFICATE"), "{e}");
        let e = client_config(dir.path(), "oar").unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = client_config(&dir.path().join("nope.pem"), "oar").unwrap_err().to_string();
        assert!(e.contains("nope.pem"), "{e}");
        let e = client_config(&files.ca, "not a name!").unwrap_err().to_string();
        assert!(e.contains("not a name!"), "{e}");
    }
}
