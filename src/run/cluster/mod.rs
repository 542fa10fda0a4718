//! Launchers for real clusters: `oar cluster ssh` (fan-out over ssh) and `oar cluster k8s`
//! (Kubernetes manifests). `mpirun` and `srun` need no launcher: `oar train --num-servers S`
//! under them meets at a rendezvous (see [`crate::run::rendezvous`]).

pub mod k8s;
pub mod ssh;
