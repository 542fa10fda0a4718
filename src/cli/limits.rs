//! Bounds on peers as flags, each checked: a server's (`oar pserver`, and `oar train` in the
//! server role), resolved into [`Limits`]; `oar serve`'s ([`serve_limits`]); and the one parser
//! of seconds flags, at most 30 days.

use std::time::Duration;

use clap::Args;

use crate::protocol::NonFinite;
use crate::server::Limits;

/// Bounds on what peers can make a server hold, and what it does with bad numbers.
#[derive(Args, Clone, Debug)]
pub struct LimitArgs {
    /// Connections a server keeps open at once (a trainer holds one per server port); more
    /// are refused with a clear error.
    #[arg(long, env = "OAR_MAX_CONNECTIONS", default_value_t = 512)]
    pub max_connections: usize,
    /// Connections one address may hold before their handshake completes; more are refused
    /// with a clear error, so one peer cannot take every place while trainers reconnect.
    #[arg(long, env = "OAR_MAX_PENDING_PER_ADDRESS", default_value_t = 64)]
    pub max_pending_per_address: usize,
    /// Seconds a new connection has to complete its handshake.
    #[arg(long, env = "OAR_HANDSHAKE_TIMEOUT", default_value_t = 10.0)]
    pub handshake_timeout: f64,
    /// Seconds of silence before TCP keepalive probes a peer (three unanswered probes, a third
    /// of this apart, and the connection is dropped as a vanished host); 0: off.
    #[arg(long, env = "OAR_KEEPALIVE", default_value_t = 30.0)]
    pub keepalive: f64,
    /// MiB the declared tables may take on a server before their first row.
    #[arg(long, env = "OAR_MAX_DECLARE_MB", default_value_t = 1024)]
    pub max_declare_mb: u64,
    /// MiB the receive buffers of all a server's connections may hold together; a frame past
    /// it is refused, naming this flag.
    #[arg(long, env = "OAR_MAX_RECEIVE_MB", default_value_t = 4096)]
    pub max_receive_mb: u64,
    /// A push holding a NaN, an infinity or a value beyond ±1e18 is never applied: `fail` refuses it and fails the
    /// trainer that sent it, `skip` leaves it out (counted and logged).
    #[arg(long, env = "OAR_NONFINITE", value_enum, default_value_t = NonFinite::Fail)]
    pub nonfinite: NonFinite,
}

impl Default for LimitArgs {
    fn default() -> LimitArgs {
        let d = Limits::default();
        LimitArgs {
            max_connections: d.max_connections,
            max_pending_per_address: d.max_pending_per_address,
            handshake_timeout: d.handshake_timeout.as_secs_f64(),
            keepalive: d.keepalive.map_or(0.0, |k| k.as_secs_f64()),
            max_declare_mb: d.max_declare_bytes >> 20,
            max_receive_mb: (d.max_receive_bytes >> 20) as u64,
            nonfinite: d.nonfinite,
        }
    }
}

use crate::train::job_config::MAX_SECONDS;

/// A flag's seconds as a duration: a number in `0..=MAX_SECONDS` (no NaN, no 1e300).
pub fn seconds(flag: &str, v: f64) -> anyhow::Result<Duration> {
    // 1e300 reads better than its 301 digits.
    let shown = if v.abs() < 1e9 { format!("{v}") } else { format!("{v:e}") };
    anyhow::ensure!(
        (0.0..=MAX_SECONDS as f64).contains(&v),
        "--{flag} must be a number of seconds in 0..={MAX_SECONDS} (30 days), not {shown}"
    );
    Ok(Duration::from_secs_f64(v))
}

/// `oar serve`'s connections from one address unless its flag says: a quarter of the default
/// total, so one peer cannot take every place, and room for a proxy's keep-alive pool.
const DEFAULT_PER_ADDRESS: usize = 256;

/// The largest `--max-body-mib`: 4 GiB, what one reservation of [`crate::base::http::Bodies`] holds.
const MAX_BODY_MIB: usize = 4096;
/// The largest `--max-buffered-mib`: 1 TiB.
const MAX_BUFFERED_MIB: usize = 1 << 20;

/// `oar serve`'s bounds on a client, each flag checked.
pub(super) fn serve_limits(a: &super::args::ServeArgs) -> anyhow::Result<crate::base::http::Limits> {
    anyhow::ensure!(
        (1..=1 << 16).contains(&a.max_connections),
        "--max-connections must be 1 to 65536, not {}",
        a.max_connections
    );
    let per_address = a.max_connections_per_address.unwrap_or(DEFAULT_PER_ADDRESS.min(a.max_connections));
    anyhow::ensure!(
        (1..=a.max_connections).contains(&per_address),
        "--max-connections-per-address must be 1 to --max-connections ({}), not {per_address}",
        a.max_connections
    );
    let read_timeout = seconds("read-timeout", a.read_timeout)?;
    anyhow::ensure!(!read_timeout.is_zero(), "--read-timeout must be above 0");
    anyhow::ensure!(
        (1..=MAX_BODY_MIB).contains(&a.max_body_mib),
        "--max-body-mib must be 1 to {MAX_BODY_MIB}, not {}",
        a.max_body_mib
    );
    anyhow::ensure!(
        (a.max_body_mib..=MAX_BUFFERED_MIB).contains(&a.max_buffered_mib),
        "--max-buffered-mib must be --max-body-mib ({}) to {MAX_BUFFERED_MIB}, not {}: else no body of the largest size fits",
        a.max_body_mib,
        a.max_buffered_mib
    );
    Ok(crate::base::http::Limits {
        connections: a.max_connections,
        per_address,
        read_timeout,
        max_body: a.max_body_mib << 20,
        buffered: a.max_buffered_mib << 20,
    })
}

/// A flag's whole seconds, checked as [`seconds`].
pub fn whole_seconds(flag: &str, v: u64) -> anyhow::Result<Duration> {
    anyhow::ensure!(v <= MAX_SECONDS, "--{flag} must be a number of seconds in 0..={MAX_SECONDS} (30 days), not {v}");
    Ok(Duration::from_secs(v))
}

impl LimitArgs {
    /// The limits, each flag checked.
    pub fn limits(&self) -> anyhow::Result<Limits> {
        anyhow::ensure!(self.max_connections > 0, "--max-connections must be at least 1");
        anyhow::ensure!(self.max_pending_per_address > 0, "--max-pending-per-address must be at least 1");
        let handshake_timeout = seconds("handshake-timeout", self.handshake_timeout)?;
        anyhow::ensure!(!handshake_timeout.is_zero(), "--handshake-timeout must be above 0");
        let keepalive = seconds("keepalive", self.keepalive)?;
        Ok(Limits {
            max_connections: self.max_connections,
            max_pending_per_address: self.max_pending_per_address,
            handshake_timeout,
            // Below a second the kernel's keepalive has no unit to express it.
            keepalive: (!keepalive.is_zero()).then(|| keepalive.max(Duration::from_secs(1))),
            max_declare_bytes: self.max_declare_mb.saturating_mul(1 << 20),
            nonfinite: self.nonfinite,
            max_receive_bytes: usize::try_from(self.max_receive_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
            ..Limits::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_servers_and_bad_numbers_are_refused() {
        let d = LimitArgs::default().limits().unwrap();
        let s = Limits::default();
        assert_eq!(
            (d.max_connections, d.keepalive, d.max_declare_bytes),
            (s.max_connections, s.keepalive, s.max_declare_bytes)
        );
        let e = LimitArgs { keepalive: f64::NAN, ..LimitArgs::default() }.limits().unwrap_err().to_string();
        assert!(e.contains("--keepalive must be a number of seconds"), "{e}");
        let off = LimitArgs { keepalive: 0.0, ..LimitArgs::default() }.limits().unwrap();
        assert_eq!(off.keepalive, None);
        assert!(LimitArgs { max_connections: 0, ..LimitArgs::default() }.limits().is_err());
    }
}
