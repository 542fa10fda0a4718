//! Launchers for real clusters: `oar cluster ssh` (fan-out over ssh) and `oar cluster k8s`
//! (Kubernetes manifests). `mpirun` and `srun` need no launcher: `oar train --num-servers S`
//! under them meets at a rendezvous (see [`crate::run::rendezvous`]).
//!
//! Engines configure oar; oar does not drive engines. mpirun, srun and Kubernetes start the same
//! `oar train` command everywhere, and each process learns its role from the engine's variables
//! (a rank and `--num-servers`, then the rendezvous) or from PaddlePaddle's (Fleet, which the ssh
//! fan-out and the Kubernetes manifests set, so their server lists are known up front and need no
//! rendezvous). Only the ssh fan-out has a launcher of ours, because ssh has no job model.

pub mod k8s;
pub mod ssh;
