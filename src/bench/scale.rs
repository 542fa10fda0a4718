//! The scale model: samples/s of S servers x N async trainers from what a step costs, each cost
//! measured (`oar bench --hosts` measures them in each run and prints the model's rate beside
//! the measured one; the same function projects clusters of many machines: the book's
//! measurements, "Across hosts").
//!
//! A trainer's step is a cycle: it pulls, computes, pushes, and the servers handle its
//! requests, each part waiting for the one before. The N trainers are the customers of a
//! closed queueing network, solved by mean value analysis (Reiser and Lavenberg, 1980) for 1,
//! 2, ..., N of them, with these stations:
//! - **the CPUs**: the trainer's compute and the servers' handling of its step. With every
//!   process on one machine (this VM) all of it shares that machine's cores; on a cluster a
//!   trainer computes on its own machine and each server's cores handle its 1/S share.
//!   The kernel's share of the CPU (copying to and from sockets) runs while the bytes are on the
//!   wire: it counts in full for the cores' capacity, but a step waits for it only where it is
//!   longer than the wire's time.
//! - **each way of the network**: a step's bytes take what a probe measured on rested links
//!   ([`Way`], [`super::transfer`]). A server's link is shared by all the trainers: a trainer's
//!   bytes are spread over the S servers' links, so each way is a station whose queue is one
//!   server link's busy time per step (its share of the bytes at the link's payload rate), and
//!   whose delay is the rest of the alone time.
//!
//! The cores are a load-dependent station, solved exactly: j steps at once go j times as fast
//! as one, up to the cores. A step's parts at the S servers (its bytes on their links; on a
//! cluster, their CPUs) are a fork and a join: the step goes on when the last part ends, so it
//! waits the longest of S waits, which the model takes as H(S) = 1 + 1/2 + ... + 1/S times one
//! part's wait, as for the largest of S independent exponential waits (the bound Nelson and
//! Tantawi, 1988, give for fork-join queues).
//!
//! Unlike the least of the caps (what this model was first), the network shows what two busy
//! resources in a row cost together: a trainer that waits for CPU leaves its link idle, and one
//! that waits for a server's link leaves its CPU idle.

/// What one sample costs, as measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// CPU seconds a trainer spends on a sample (all its threads, user and kernel).
    pub trainer_cpu: f64,
    /// CPU seconds the servers spend on a sample, together.
    pub server_cpu: f64,
    /// Of the two above, the kernel's (system time): mostly copying to and from sockets.
    pub kernel_cpu: f64,
    /// Frame bytes a sample sends to the servers.
    pub to: f64,
    /// Frame bytes a sample gets from the servers.
    pub from: f64,
}

/// What the links give a step's bytes, one way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Way {
    /// Seconds a step's bytes take, alone on a rested link, the request's round trip included.
    pub alone: f64,
    /// Bytes/s a server's link carries of a step's bytes once under way (infinite: not a bound).
    pub rate: f64,
}

/// TCP's payload in a 1,514-byte Ethernet frame with timestamps (1,448 bytes): the share of a
/// link's rate a flow's bytes get once under way (a probe's one flow got 12.0 MB/s of 100
/// Mbit/s and 119.7 of 1 Gbit/s, the book's measurements, "The scale model").
pub const PAYLOAD_SHARE: f64 = 1448.0 / 1514.0;

impl Way {
    /// A link of `rate` bytes/s that nobody measured (a projection): `bytes` at the payload's
    /// share of the rate.
    pub fn nominal(rate: f64, bytes: f64) -> Way {
        let payload = PAYLOAD_SHARE * rate;
        Way { alone: bytes / payload, rate: payload }
    }
}

/// A job's shape and where it runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Servers, each with a link of its own.
    pub servers: f64,
    /// Trainers, each with a link of its own.
    pub trainers: usize,
    /// Samples per step of a trainer.
    pub batch: f64,
    /// The links' ways (to the servers, from them) for a step's bytes; `None`: not a bound.
    pub links: Option<[Way; 2]>,
    /// Cores every process shares (all on one machine); `None`: a machine each.
    pub shared_cores: Option<f64>,
    /// Cores each server has, on a machine of its own.
    pub server_cores: f64,
}

/// The model's answer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Samples/s of the whole job.
    pub samples_per_second: f64,
    /// The share of the time the busiest CPUs work (the shared machine's, or a server's).
    pub cores_busy: f64,
    /// The share of the time a server's link works, its busier way.
    pub links_busy: f64,
}

/// A station of a step's cycle.
#[derive(Clone, Copy, Debug)]
enum Station {
    /// A queue (a server link's way): a delay every visit takes whatever else waits, the
    /// queue's demand, and how many times a part's wait a visit waits (the fork-join's H(S); 1
    /// for a station visited whole).
    Queue { delay: f64, queue: f64, joins: f64 },
    /// `cores` cores: a visit alone takes `alone`, and needs `demand` of one core's time (more
    /// than `alone` when the kernel's part of it overlaps the wire), so j visits at once end at
    /// min(j / alone, cores / demand) a second; `joins` as for a queue.
    Cores { alone: f64, demand: f64, cores: f64, joins: f64 },
}

/// Visits a cores station ends a second with `j` in it.
fn cores_rate(alone: f64, demand: f64, cores: f64, j: usize) -> f64 {
    (j as f64 / alone.max(f64::MIN_POSITIVE)).min(cores / demand.max(f64::MIN_POSITIVE))
}

/// 1 + 1/2 + ... + 1/n, for the largest of n waits.
fn harmonic(n: f64) -> f64 {
    (1..=n.max(1.0).round() as u64).map(|k| 1.0 / k as f64).sum()
}

/// The model's samples/s for `shape` at `costs`, and how busy the shared resources are.
pub fn predict(costs: &Costs, shape: &Shape) -> Prediction {
    let batch = shape.batch;
    let joins = harmonic(shape.servers);
    let cpu = (costs.trainer_cpu + costs.server_cpu) * batch;
    let wire = shape.links.map_or(0.0, |[to, from]| to.alone + from.alone);
    // The share of the CPU that runs while the bytes are on the wire.
    let hidden = (costs.kernel_cpu * batch).min(wire) / cpu.max(f64::MIN_POSITIVE);
    // The busiest cores' time per step, for their busy share.
    let (mut stations, cores_per_step) = match shape.shared_cores {
        Some(cores) => {
            (vec![Station::Cores { alone: cpu * (1.0 - hidden), demand: cpu, cores, joins: 1.0 }], cpu / cores)
        }
        None => {
            let own = costs.trainer_cpu * batch * (1.0 - hidden);
            let demand = costs.server_cpu * batch / shape.servers;
            let server = Station::Cores { alone: demand * (1.0 - hidden), demand, cores: shape.server_cores, joins };
            (vec![Station::Queue { delay: own, queue: 0.0, joins: 1.0 }, server], demand / shape.server_cores)
        }
    };
    let mut link_queues = [0.0; 2];
    if let Some(ways) = shape.links {
        let bytes = [costs.to * batch, costs.from * batch];
        for (i, way) in ways.iter().enumerate() {
            let busy = bytes[i] / (shape.servers * way.rate);
            link_queues[i] = busy;
            stations.push(Station::Queue { delay: (way.alone - busy).max(0.0), queue: busy, joins });
        }
    }
    let steps = solve(&stations, shape.trainers);
    Prediction {
        samples_per_second: steps * batch,
        cores_busy: steps * cores_per_step,
        links_busy: steps * link_queues[0].max(link_queues[1]),
    }
}

/// Mean value analysis: the cycles/s of `customers` going round `stations`. Exact where every
/// station is visited whole (for cores, with the chances of each number of visits in them,
/// Reiser and Lavenberg's load-dependent form); a forked station's customer waits `joins`
/// times a part's wait, while each part, counted in the queue, waits one.
fn solve(stations: &[Station], customers: usize) -> f64 {
    // Per station: its mean queue (a queue), or the chances of 0, 1, ... visits in it (cores).
    let mut queued = vec![0.0; stations.len()];
    let mut chances: Vec<Vec<f64>> = vec![vec![1.0]; stations.len()];
    let mut throughput = 0.0;
    for n in 1..=customers {
        let residence: Vec<f64> = stations
            .iter()
            .enumerate()
            .map(|(k, s)| match *s {
                Station::Queue { delay, queue, joins } => delay + queue * (1.0 + joins * queued[k]),
                Station::Cores { alone, demand, cores, joins } => {
                    let rate = |j| cores_rate(alone, demand, cores, j);
                    let r: f64 = (1..=n).map(|j| j as f64 / rate(j) * chances[k][j - 1]).sum();
                    alone + joins * (r - alone).max(0.0)
                }
            })
            .collect();
        throughput = n as f64 / residence.iter().sum::<f64>().max(f64::MIN_POSITIVE);
        for (k, s) in stations.iter().enumerate() {
            match *s {
                Station::Queue { queue, .. } => queued[k] = throughput * queue * (1.0 + queued[k]),
                Station::Cores { alone, demand, cores, .. } => {
                    let rate = |j| cores_rate(alone, demand, cores, j);
                    let mut p: Vec<f64> =
                        (0..=n).map(|j| if j == 0 { 0.0 } else { throughput / rate(j) * chances[k][j - 1] }).collect();
                    // By subtraction, which rounding can take below 0 at full load.
                    p[0] = (1.0 - p[1..].iter().sum::<f64>()).max(0.0);
                    chances[k] = p;
                }
            }
        }
    }
    throughput
}

#[cfg(test)]
mod tests {
    use super::*;

    const CTR: Costs = Costs { trainer_cpu: 60e-6, server_cpu: 30e-6, kernel_cpu: 0.0, to: 8_000.0, from: 7_000.0 };

    fn shape(servers: f64, trainers: usize, links: Option<[Way; 2]>, shared: Option<f64>) -> Shape {
        Shape { servers, trainers, batch: 100.0, links, shared_cores: shared, server_cores: 1.0 }
    }

    fn gbit(costs: &Costs) -> Option<[Way; 2]> {
        Some([Way::nominal(125e6, costs.to * 100.0), Way::nominal(125e6, costs.from * 100.0)])
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn one_trainer_alone_takes_its_cpu_and_its_bytes_one_after_the_other() {
        let p = predict(&CTR, &shape(2.0, 1, gbit(&CTR), Some(2.0)));
        let step = 90e-6 * 100.0 + 15_000.0 * 100.0 / (PAYLOAD_SHARE * 125e6);
        assert!(close(p.samples_per_second, 100.0 / step), "{p:?}");
    }

    #[test]
    fn many_trainers_on_one_machine_approach_its_cores_from_below() {
        let cap = 2.0 / 90e-6;
        let mut last = 0.0;
        for n in [1, 2, 4, 16, 256] {
            let p = predict(&CTR, &shape(2.0, n, gbit(&CTR), Some(2.0)));
            assert!(p.samples_per_second > last && p.samples_per_second < cap, "{n}: {p:?}");
            last = p.samples_per_second;
        }
        assert!(last > 0.99 * cap, "{last}");
    }

    #[test]
    fn as_many_trainers_as_cores_never_wait_for_one() {
        let p = predict(&CTR, &shape(2.0, 2, None, Some(2.0)));
        assert!(close(p.samples_per_second, 2.0 * 100.0 / (90e-6 * 100.0)), "{p:?}");
        let three = predict(&CTR, &shape(2.0, 3, None, Some(2.0)));
        assert!(close(three.samples_per_second, p.samples_per_second), "a third waits: {three:?}");
    }

    #[test]
    fn many_trainers_on_one_server_link_approach_its_rate() {
        let cap = PAYLOAD_SHARE * 125e6 / 8_000.0; // the busier way binds
        let p = predict(&CTR, &shape(1.0, 400, gbit(&CTR), None));
        assert!(p.samples_per_second <= cap * (1.0 + 1e-9) && p.samples_per_second > 0.99 * cap, "{p:?}");
        assert!(p.links_busy > 0.99 && p.links_busy <= 1.0 + 1e-9, "{p:?}");
    }

    #[test]
    fn two_busy_resources_in_a_row_lose_more_than_the_least_cap() {
        // Trainers and a server link each could carry about the same alone; together less.
        let links = gbit(&CTR);
        let p = predict(&CTR, &shape(1.0, 2, links, None));
        let trainers = 2.0 * 100.0 / (60e-6 * 100.0 + 15_000.0 * 100.0 / (PAYLOAD_SHARE * 125e6));
        let link = PAYLOAD_SHARE * 125e6 / 8_000.0;
        assert!(p.samples_per_second < 0.95 * trainers.min(link), "{p:?} against {trainers} and {link}");
    }

    #[test]
    fn the_kernels_copies_overlap_the_wire() {
        // Of the same CPU, 20 us a sample copies bytes: the step is shorter by that much.
        let copying = Costs { kernel_cpu: 20e-6, ..CTR };
        let p = predict(&copying, &shape(2.0, 1, gbit(&CTR), Some(2.0)));
        let step = 90e-6 * 100.0 + 15_000.0 * 100.0 / (PAYLOAD_SHARE * 125e6) - 20e-6 * 100.0;
        assert!(close(p.samples_per_second, 100.0 / step), "{p:?}");
    }

    #[test]
    fn a_step_spread_over_servers_waits_for_the_slowest_part() {
        assert!(close(harmonic(1.0), 1.0) && close(harmonic(4.0), 25.0 / 12.0));
        // The same link load, once as one server's link and once spread over four: at four
        // the step waits the longest of four parts' waits, so it goes slower than the queue
        // alone would say.
        let at = |servers: f64| {
            let links = Some([Way { alone: 0.01, rate: 1e8 / servers }, Way { alone: 0.01, rate: 1e8 / servers }]);
            predict(&CTR, &Shape { servers, trainers: 8, batch: 100.0, links, shared_cores: None, server_cores: 1e9 })
        };
        let (one, four) = (at(1.0), at(4.0));
        assert!(close(one.links_busy / one.samples_per_second, four.links_busy / four.samples_per_second));
        assert!(four.samples_per_second < one.samples_per_second, "{one:?} {four:?}");
    }

    #[test]
    fn on_a_cluster_the_servers_cores_bound_their_share() {
        let p = predict(&CTR, &shape(1.0, 1000, None, None));
        assert!(p.samples_per_second < 1.0 / 30e-6 && p.samples_per_second > 0.99 / 30e-6, "{p:?}");
        assert!(p.cores_busy > 0.99, "{p:?}");
    }
}
