//! TLS as flags (`oar pserver`, `oar train` in either role), resolved into the server's and
//! the client's rustls configurations by [`crate::security::tls`].

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

/// TLS between trainers and servers: servers present `--tls-cert` with `--tls-key`, clients
/// check it against `--tls-ca`. `oar tls --out DIR` makes all three; `oar launch --tls` makes
/// and hands them out itself.
#[derive(Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// PEM certificate (chain) a server presents; with it every connection to the server must
    /// speak TLS.
    #[arg(long, env = "OAR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "OAR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate authority that issued the servers' certificate: with it a trainer speaks
    /// TLS to every server and checks its certificate.
    #[arg(long, env = "OAR_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Name the servers' certificate must be issued for (one certificate serves every server,
    /// wherever it runs).
    #[arg(long, env = "OAR_TLS_NAME", default_value = crate::security::tls::DEFAULT_NAME)]
    pub tls_name: String,
}

impl TlsArgs {
    /// The server's TLS, if `--tls-cert` was given.
    pub fn server(&self) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(crate::security::tls::server_config(cert, key)?)),
            (None, None) => Ok(None),
            _ => anyhow::bail!("--tls-cert and --tls-key go together"),
        }
    }

    /// The client's TLS, if `--tls-ca` was given.
    pub fn client(&self) -> anyhow::Result<Option<crate::security::tls::ClientTls>> {
        Ok(self.tls_ca.as_deref().map(|ca| crate::security::tls::client_config(ca, &self.tls_name)).transpose()?)
    }
}
