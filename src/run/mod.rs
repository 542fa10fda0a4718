//! Running a job's processes: the one-machine launcher, the cluster engines, the supervision of
//! children and the rendezvous by rank.

pub mod cluster;
pub mod launch;
pub mod rendezvous;
pub mod supervise;
