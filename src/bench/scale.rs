//! The scale model: samples/s of S servers x N async trainers over links of one rate, from
//! what a sample costs (the CPU seconds of its trainer and of the servers, the bytes it sends
//! to the servers and gets back). `oar bench --hosts` measures the costs in each run and
//! prints the model's rate beside the measured one; the same function projects clusters of
//! many machines (the book's measurements, "Across hosts", 2026-11-30).
//!
//! The rate is the least of three caps:
//! - **trainers**: each trainer computes a sample and moves its bytes over its own link in
//!   turn (it pulls, computes, pushes: the two directions of its link take turns), so a trainer
//!   takes `trainer_cpu + (to + from) / (efficiency x rate)` per sample;
//! - **server links**: each server's link carries `1 / S` of every sample's bytes each way,
//!   both ways at once (its trainers are not in step: one pushes while another pulls);
//! - **cores**: with every process on one machine of `shared_cores` (this VM), all CPU seconds
//!   share them; on a cluster, a server's cores bound its share of `server_cpu`.

/// The share of a link's rate a job's frames get: TCP/IP and Ethernet headers (about 5% at
/// 1,500-byte packets), acknowledgements, and the gaps where a link waits for the next
/// request. Set from 2 servers x 2 trainers at 1 Gbit/s (both models within 12%).
pub const LINK_EFFICIENCY: f64 = 0.8;

/// What one sample costs, as measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// CPU seconds a trainer spends on a sample (all its threads).
    pub trainer_cpu: f64,
    /// CPU seconds the servers spend on a sample, together.
    pub server_cpu: f64,
    /// Frame bytes a sample sends to the servers.
    pub to: f64,
    /// Frame bytes a sample gets from the servers.
    pub from: f64,
}

/// A job's shape and where it runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Servers, each with a link of its own.
    pub servers: f64,
    /// Trainers, each with a link of its own.
    pub trainers: f64,
    /// Each link's rate in bytes/s, each way; `None`: not a bound.
    pub rate: Option<f64>,
    /// Cores every process shares (all on one machine); `None`: a machine each.
    pub shared_cores: Option<f64>,
    /// Cores each server has, on a machine of its own.
    pub server_cores: f64,
}

/// What binds a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The trainers: their compute and their own links.
    Trainers,
    /// The servers' links.
    ServerLinks,
    /// The CPUs: the shared machine's, or the servers' own.
    Cores,
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Bound::Trainers => "trainers",
            Bound::ServerLinks => "server links",
            Bound::Cores => "cores",
        })
    }
}

/// The model's samples/s for `shape` at `costs`, and what binds it.
pub fn predict(costs: &Costs, shape: &Shape) -> (f64, Bound) {
    let wire = |bytes: f64| shape.rate.map_or(0.0, |r| bytes / (LINK_EFFICIENCY * r));
    let trainers = shape.trainers / (costs.trainer_cpu + wire(costs.to + costs.from));
    let server_links = shape.rate.map_or(f64::INFINITY, |_| shape.servers / wire(costs.to.max(costs.from)));
    let cores = match shape.shared_cores {
        Some(c) => c / (costs.trainer_cpu + costs.server_cpu),
        None => shape.servers * shape.server_cores / costs.server_cpu,
    };
    let caps = [(trainers, Bound::Trainers), (server_links, Bound::ServerLinks), (cores, Bound::Cores)];
    caps.into_iter().fold((f64::INFINITY, Bound::Trainers), |least, cap| if cap.0 < least.0 { cap } else { least })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CTR: Costs = Costs { trainer_cpu: 60e-6, server_cpu: 30e-6, to: 8_000.0, from: 7_000.0 };

    fn shape(servers: f64, trainers: f64, rate: Option<f64>, shared: Option<f64>) -> Shape {
        Shape { servers, trainers, rate, shared_cores: shared, server_cores: 1.0 }
    }

    #[test]
    fn unshaped_on_one_machine_the_cores_bind() {
        let (x, bound) = predict(&CTR, &shape(2.0, 2.0, None, Some(2.0)));
        assert_eq!(bound, Bound::Cores);
        assert!((x - 2.0 / 90e-6).abs() < 1e-6);
    }

    #[test]
    fn a_trainer_adds_its_bytes_over_its_link_to_its_compute() {
        let rate = 125e6;
        let (x, bound) = predict(&CTR, &shape(2.0, 2.0, Some(rate), Some(2.0)));
        assert_eq!(bound, Bound::Trainers);
        let per_sample = 60e-6 + 15_000.0 / (LINK_EFFICIENCY * 125e6);
        assert!((x - 2.0 / per_sample).abs() < 1e-6, "{x}");
    }

    #[test]
    fn one_server_link_for_many_trainers_binds() {
        let rate = 125e6;
        let (x, bound) = predict(&CTR, &shape(1.0, 16.0, Some(rate), None));
        assert_eq!(bound, Bound::ServerLinks);
        assert!((x - LINK_EFFICIENCY * 125e6 / 8_000.0).abs() < 1e-6, "{x}: the busier way binds");
    }

    #[test]
    fn on_a_cluster_the_servers_cores_bound_their_share() {
        let (x, bound) = predict(&CTR, &shape(1.0, 1000.0, None, None));
        assert_eq!(bound, Bound::Cores);
        assert!((x - 1.0 / 30e-6).abs() < 1e-6, "{x}");
    }
}
